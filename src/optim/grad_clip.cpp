#include "src/optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "kernels/gpu_runtime.h"
#include "kernels/optim.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/dispatch.h"
#include "src/core/ops/elementwise.h"

namespace vlm::optim {

namespace {

// Sum of squares of every CUDA gradient of one device: each tensor writes its fixed-block fp64
// partials into one device buffer, one kernel adds them in order, one copy brings the total back:
// the single synchronization of the step (on the device's current stream; it also throws any
// deferred device error). Deterministic: no atomics anywhere.
double cuda_sum_squares(const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  const Device device = grads[0].device();
  return dispatch_device(
      "grad_norm_squared", device, [] { return 0.0; },
      [&](auto stream) {
        int64_t total_partials = 0;
        for (const auto& g : grads)
          total_partials += kernels::cuda::sum_squares_num_partials(g.numel());
        if (total_partials == 0) return 0.0;
        Tensor partials = Tensor::empty({total_partials + 1}, DType::f64, device);
        double* base = partials.data<double>();
        int64_t at = 0;
        for (const auto& g : grads) {
          dispatch(
              "grad_norm_squared", device, g.dtype(), [](auto) {},
              [&](auto t, void* s) {
                using T = decltype(t);
                kernels::cuda::sum_squares_partials<T>(base + at, g.data<T>(), g.numel(), s);
              });
          at += kernels::cuda::sum_squares_num_partials(g.numel());
        }
        kernels::cuda::sum_doubles(base + total_partials, base, total_partials, stream);
        double total = 0;
        kernels::cuda::memcpy_d2h(&total, base + total_partials, sizeof total, stream);
        current_stream(device).synchronize();
        return total;
      });
}

} // namespace

double grad_norm_squared(const std::vector<Tensor>& params) {
  // CPU gradients in list order, then the CUDA ones (per device, in order of first appearance).
  double total = 0;
  std::vector<std::vector<Tensor>> cuda_grads; // grouped by device
  for (const auto& p : params) {
    VLM_CHECK(p.defined(), "grad_norm_squared: undefined parameter in the list");
    if (!p.grad().defined()) continue;
    const Tensor g = p.grad().contiguous();
    if (g.device().is_cuda()) {
      auto it = std::find_if(cuda_grads.begin(), cuda_grads.end(),
                             [&](const auto& v) { return v[0].device() == g.device(); });
      if (it == cuda_grads.end())
        cuda_grads.push_back({g});
      else
        it->push_back(g);
      continue;
    }
    total += VLM_DISPATCH_FLOAT(g.dtype(), "grad_norm_squared", T, [&] {
      return kernels::cpu::sum_squares<T>(g.data<T>(), g.numel());
    });
  }
  for (const auto& grads : cuda_grads) total += cuda_sum_squares(grads);
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
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad(); // a handle on the same storage
    VLM_CHECK(g.is_contiguous(), "scale_grads: the gradient of '", p.name(),
              "' must be contiguous, got ", g.desc());
    scale_(g, coef);
  }
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

} // namespace vlm::optim
