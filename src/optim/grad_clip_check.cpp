#include "src/optim/grad_clip_check.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/optim.h"
#include "src/base/rng.h"
#include "src/core/dispatch.h"
#include "src/core/ops/self_check.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/tensor.h"

namespace vlm::optim {

namespace {

// Sizes of the check's gradients: a single element, odd sizes below one chunk, exactly one chunk
// (kGradNormChunk = 32768) and one over 64k elements (three chunks, the last partial). One more
// starts one element into its buffer: not 16-byte aligned (FSDP shards view a flat gradient at
// any offset), so the kernels take their element-by-element path.
const std::vector<int64_t> kSizes = {1, 7, 1000, 32768, 70001};
constexpr int64_t kUnalignedSize = 4099;

// One gradient of the check: its values on the host (the reference) and a device buffer holding
// them from element `offset` on.
struct CheckGrad {
  Tensor host;   // [n], the gradient's dtype
  Tensor device; // [offset + n], the same dtype
  int64_t offset = 0;
  kernels::cuda::GradSpan span() const {
    return {static_cast<char*>(device.data_ptr()) + offset * int64_t(dtype_size(device.dtype())),
            host.numel(), host.dtype() == DType::bf16};
  }
  std::vector<double> device_values() const {
    return device.to(Device::cpu()).to_doubles(); // [offset + n]
  }
};

// x rounded to the gradient's dtype (from an exact f64 value: one rounding to fp32, then bf16).
double round_to(DType dtype, double x) {
  const float f = float(x);
  return dtype == DType::bf16 ? double(float(bf16(f))) : double(f);
}

// The kernels' error on gradients of the mix: squared norm and clip coefficient (from
// multi_sum_squares) against the CPU in f64, then the gradients scaled by the device coefficient
// and by a host one (multi_scale's two paths) against the same products computed on the host.
//
// Tolerance 1e-9 (relative). Norm²: both sides add the same ~1.1e5 non-negative squares in f64 in
// different orders, each within (n - 1) * 2^-53 ~ 1.2e-11 of the exact sum. Coefficient: the same
// fp64 formula on norms within that bound. Scaled gradients: the kernels compute fp32 c * x
// rounded once (then to bf16), and the host rounds the exact f64 product (24-bit by 24-bit
// mantissas) the same way from the device's own coefficient: equal, error 0. A dropped tensor,
// chunk or element, a wrong dtype or a missed scaling moves a result by more than 1e-6.
double measure(Device device, bool has_f32, bool has_bf16) {
  Rng rng(20260703);
  std::vector<CheckGrad> grads;
  auto dtype_of = [&](size_t k) {
    if (has_f32 && has_bf16) return k % 2 == 0 ? DType::f32 : DType::bf16;
    return has_bf16 ? DType::bf16 : DType::f32;
  };
  for (size_t k = 0; k <= kSizes.size(); k++) {
    const bool unaligned = k == kSizes.size();
    const int64_t n = unaligned ? kUnalignedSize : kSizes[k];
    const int64_t offset = unaligned ? 1 : 0;
    // The single element is large, so that dropping it moves the norm by far more than 1e-9.
    const Tensor buffer = Tensor::randn({offset + n}, rng, dtype_of(k), k == 0 ? 30.0 : 1.0);
    CheckGrad g;
    g.host = slice(buffer, 0, offset, offset + n).contiguous();
    g.device = buffer.to(device);
    g.offset = offset;
    grads.push_back(g);
  }
  std::vector<kernels::cuda::GradSpan> spans;
  for (const auto& g : grads) spans.push_back(g.span());
  const auto count = int64_t(spans.size());

  double want_sq = 0;
  for (const auto& g : grads)
    for (double x : g.host.to_doubles()) want_sq += x * x;
  const double max_norm = 0.5 * std::sqrt(want_sq); // a coefficient near 0.5: clipping happens
  const double want_coef = std::min(1.0, max_norm / (std::sqrt(want_sq) + 1e-6));
  constexpr double kHostCoef = 0.75;

  Tensor out = Tensor::empty({2}, DType::f64, device);
  const int64_t np = kernels::cuda::multi_sum_squares_num_partials(spans.data(), count);
  Tensor partials = Tensor::empty({np}, DType::f64, device);
  dispatch_device(
      "grad_norm self-check", device, [] {},
      [&](auto stream) {
        kernels::cuda::multi_sum_squares(out.data<double>(), partials.data<double>(), spans.data(),
                                         count, max_norm, stream);
        kernels::cuda::multi_scale(spans.data(), count, out.data<double>() + 1, 1.0, stream);
        kernels::cuda::multi_scale(spans.data(), count, nullptr, kHostCoef, stream);
      });
  const std::vector<double> got = out.to_doubles();
  double error =
      std::max(std::abs(got[0] - want_sq) / want_sq, std::abs(got[1] - want_coef) / want_coef);
  if (!std::isfinite(error)) return INFINITY;
  const double device_coef = double(float(got[1])), host_coef = double(float(kHostCoef));
  for (const auto& g : grads) {
    const DType dt = g.host.dtype();
    std::vector<double> want = g.host.to_doubles();
    for (double& x : want) x = round_to(dt, host_coef * round_to(dt, device_coef * x));
    std::vector<double> values = g.device_values();
    values.erase(values.begin(), values.begin() + g.offset);
    error = std::max(error, ops_detail::max_rel_error(values, want));
  }
  return error;
}

} // namespace

bool multi_tensor_grad_kernels_pass(Device device, bool has_f32, bool has_bf16) {
  const std::string mix = has_f32 && has_bf16 ? "f32+bf16" : (has_bf16 ? "bf16" : "f32");
  const std::string key = "multi-tensor grad norm/clip " + mix + " on " + device.str();
  return ops_detail::gpu_kernel_passes(
      key, 1e-9, [&] { return measure(device, has_f32, has_bf16); },
      "the per-tensor path (sums of squares on host copies, scale_ per gradient; slow)");
}

} // namespace vlm::optim
