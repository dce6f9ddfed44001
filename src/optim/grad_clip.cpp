#include "src/optim/grad_clip.h"

#include <cmath>

#include "kernels/optim.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"

namespace vlm::optim {

double grad_norm_squared(const std::vector<Tensor>& params) {
  double total = 0;
  for (const auto& p : params) {
    VLM_CHECK(p.defined(), "grad_norm_squared: undefined parameter in the list");
    if (!p.grad().defined()) continue;
    const Tensor g = p.grad().contiguous();
    VLM_CHECK(g.device().is_cpu(), "grad_norm_squared: no CUDA kernel yet for the gradient of '",
              p.name(), "' ", g.desc());
    total += VLM_DISPATCH_FLOAT(g.dtype(), "grad_norm_squared", T, [&] {
      return kernels::cpu::sum_squares<T>(g.data<T>(), g.numel());
    });
  }
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
