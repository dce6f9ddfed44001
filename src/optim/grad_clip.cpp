#include "src/optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "kernels/gpu_runtime.h"
#include "kernels/optim.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/dispatch.h"
#include "src/core/ops/elementwise.h"
#include "src/optim/grad_clip_check.h"

namespace vlm::optim {

namespace {

// The CUDA kernels' descriptor of a gradient (contiguous, f32 or bf16).
kernels::cuda::GradSpan span_of(const Tensor& g) {
  VLM_CHECK(g.dtype() == DType::f32 || g.dtype() == DType::bf16,
            "grad_norm: CUDA gradients must be f32 or bf16, got ", g.desc(),
            " (f64 runs on CPU only)");
  VLM_CHECK(g.is_contiguous(), "grad_norm: the gradient must be contiguous, got ", g.desc());
  return {g.data_ptr(), g.numel(), g.dtype() == DType::bf16};
}

// {sum of squares, clip coefficient} of the gradients of one CUDA device, on that device: the
// multi-tensor kernels (kernels/optim.h), nothing synchronizes. The partials' buffer goes back to
// the stream-ordered pool when this returns (after the kernels that use it, in stream order).
Tensor cuda_norm_and_coef(const std::vector<Tensor>& grads, double max_norm) {
  const Device device = grads[0].device();
  std::vector<kernels::cuda::GradSpan> spans;
  spans.reserve(grads.size());
  for (const auto& g : grads) spans.push_back(span_of(g));
  Tensor out = Tensor::empty({2}, DType::f64, device);
  const int64_t np =
      kernels::cuda::multi_sum_squares_num_partials(spans.data(), int64_t(spans.size()));
  Tensor partials = Tensor::empty({std::max<int64_t>(np, 1)}, DType::f64, device);
  dispatch_device(
      "grad_norm", device, [] {},
      [&](auto stream) {
        kernels::cuda::multi_sum_squares(out.data<double>(), partials.data<double>(), spans.data(),
                                         int64_t(spans.size()), max_norm, stream);
      });
  return out;
}

// Defined gradients grouped by device: CPU ones in list order first, then one group per CUDA
// device in order of first appearance.
struct GradsByDevice {
  std::vector<Tensor> cpu;
  std::vector<std::vector<Tensor>> cuda;
};

// Undefined parameters fail (the norm) or are skipped (scaling, make_contiguous = false).
GradsByDevice group_grads(const std::vector<Tensor>& params, bool make_contiguous) {
  GradsByDevice out;
  for (const auto& p : params) {
    VLM_CHECK(p.defined() || !make_contiguous, "grad_norm: undefined parameter in the list");
    if (!p.defined()) continue;
    if (!p.grad().defined()) continue;
    const Tensor g = make_contiguous ? p.grad().contiguous() : p.grad();
    if (!g.device().is_cuda()) {
      out.cpu.push_back(g);
      continue;
    }
    auto it = std::find_if(out.cuda.begin(), out.cuda.end(),
                           [&](const auto& v) { return v[0].device() == g.device(); });
    if (it == out.cuda.end())
      out.cuda.push_back({g});
    else
      it->push_back(g);
  }
  return out;
}

// Whether the multi-tensor kernels may run for these gradients of one CUDA device (checked on
// first use per device and dtype mix).
bool multi_kernels_pass(const std::vector<Tensor>& on_device) {
  bool has_f32 = false, has_bf16 = false;
  for (const auto& g : on_device) (g.dtype() == DType::bf16 ? has_bf16 : has_f32) = true;
  return multi_tensor_grad_kernels_pass(on_device[0].device(), has_f32, has_bf16);
}

// Sum of squares of gradients on the host (CPU ones in place, others through host copies), in
// list order.
double host_sum_squares(const std::vector<Tensor>& grads) {
  double total = 0;
  for (const Tensor& grad : grads) {
    const Tensor g = grad.device().is_cpu() ? grad : grad.to(Device::cpu()).contiguous();
    total += VLM_DISPATCH_FLOAT(g.dtype(), "grad_norm_squared", T, [&] {
      return kernels::cpu::sum_squares<T>(g.data<T>(), g.numel());
    });
  }
  return total;
}

} // namespace

double grad_norm_squared(const std::vector<Tensor>& params) {
  // CPU gradients in list order, then the CUDA ones (per device, in order of first appearance):
  // one host read per device.
  const GradsByDevice grads = group_grads(params, true);
  double total = host_sum_squares(grads.cpu);
  for (const auto& on_device : grads.cuda)
    total += multi_kernels_pass(on_device) ? cuda_norm_and_coef(on_device, 0.0).to_doubles()[0]
                                           : host_sum_squares(on_device);
  return total;
}

double grad_norm(const std::vector<Tensor>& params) { return std::sqrt(grad_norm_squared(params)); }

double clip_coefficient(double total_norm, double max_norm) {
  VLM_CHECK(max_norm > 0, "clip_coefficient: max_norm must be > 0, got ", max_norm,
            " (to disable clipping, do not clip)");
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

void scale_grads(const std::vector<Tensor>& params, double coef) {
  NoGradGuard no_grad;
  for (const auto& p : params)
    if (p.defined() && p.grad().defined())
      VLM_CHECK(p.grad().is_contiguous(), "scale_grads: the gradient of '", p.name(),
                "' must be contiguous, got ", p.grad().desc());
  const GradsByDevice grads = group_grads(params, false); // handles on the gradients' storage
  for (Tensor g : grads.cpu) scale_(g, coef);
  for (const auto& on_device : grads.cuda) { // one launch per 1024 tensors
    if (!multi_kernels_pass(on_device)) {
      for (Tensor g : on_device) scale_(g, coef);
      continue;
    }
    std::vector<kernels::cuda::GradSpan> spans;
    for (const auto& g : on_device) spans.push_back(span_of(g));
    dispatch_device(
        "scale_grads", on_device[0].device(), [] {},
        [&](auto stream) {
          kernels::cuda::multi_scale(spans.data(), int64_t(spans.size()), nullptr, coef, stream);
        });
  }
}

void scale_grads(const std::vector<Tensor>& params, const Tensor& coef) {
  VLM_CHECK(coef.defined() && coef.numel() == 1 && coef.dtype() == DType::f64,
            "scale_grads: the coefficient must be one f64 value, got ", coef.desc());
  const GradsByDevice grads = group_grads(params, false);
  if (grads.cpu.empty() && grads.cuda.empty()) return; // nothing to scale, nothing to read
  if (grads.cpu.empty() && grads.cuda.size() == 1 && grads.cuda[0][0].device() == coef.device() &&
      multi_kernels_pass(grads.cuda[0])) {
    NoGradGuard no_grad;
    std::vector<kernels::cuda::GradSpan> spans;
    for (const auto& g : grads.cuda[0]) spans.push_back(span_of(g));
    const double* c = coef.data<double>();
    dispatch_device(
        "scale_grads", coef.device(), [] {},
        [&](auto stream) {
          kernels::cuda::multi_scale(spans.data(), int64_t(spans.size()), c, 1.0, stream);
        });
    return;
  }
  const double c = coef.to_doubles()[0];
  if (c < 1.0) scale_grads(params, c);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  VLM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm,
            " (to disable clipping, do not clip; grad_norm() still measures)");
  const double total = grad_norm(params);
  if (!std::isfinite(total)) return total; // the caller decides (skip the step)
  const double coef = clip_coefficient(total, max_norm);
  if (coef < 1.0) scale_grads(params, coef);
  return total;
}

Tensor clip_grad_norm_async(const std::vector<Tensor>& params, double max_norm) {
  for (const auto& p : params) VLM_CHECK(p.defined(), "grad_norm: undefined parameter in the list");
  const GradsByDevice grads = group_grads(params, false);
  if (grads.cpu.empty() && grads.cuda.size() == 1 && multi_kernels_pass(grads.cuda[0])) {
    const std::vector<Tensor>& on_device = grads.cuda[0];
    Tensor out = cuda_norm_and_coef(on_device, max_norm);
    if (max_norm > 0) {
      std::vector<kernels::cuda::GradSpan> spans;
      for (const auto& g : on_device) spans.push_back(span_of(g));
      const double* coef = out.data<double>() + 1;
      dispatch_device(
          "clip_grad_norm", out.device(), [] {},
          [&](auto stream) {
            kernels::cuda::multi_scale(spans.data(), int64_t(spans.size()), coef, 1.0, stream);
          });
    }
    return out;
  }
  // The CPU (the reference), several devices, or kernels that failed their check: on the host.
  const double norm_sq = grad_norm_squared(params);
  double coef = 1.0;
  if (max_norm > 0 && std::isfinite(norm_sq)) {
    coef = clip_coefficient(std::sqrt(norm_sq), max_norm);
    if (coef < 1.0) scale_grads(params, coef);
  }
  return Tensor::from_vector(std::vector<double>{norm_sq, coef}, {2});
}

} // namespace vlm::optim
