#include "kernels/optim.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/lane_reduce.h"
#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

template <typename T, typename G, typename S>
void adamw_step(T* param, S* master, const G* grad, S* exp_avg, S* exp_avg_sq, int64_t n,
                const AdamWStepArgs& a) {
  // The scalars are rounded to S once, as torch does when it hands Python floats to a kernel.
  const S decay = S(1.0 - a.lr * a.weight_decay);
  const S one_minus_beta1 = S(1.0 - a.beta1);
  const S beta2 = S(a.beta2);
  const S one_minus_beta2 = S(1.0 - a.beta2);
  const S neg_step_size = S(-a.step_size);
  const S bc2_sqrt = S(a.bias_correction2_sqrt);
  const S eps = S(a.eps);
#pragma omp parallel for if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    const S g = to_acc<S>(grad[i]);
    S w = master ? master[i] : to_acc<S>(param[i]);
    w *= decay;
    // Same operation order as torch's single-tensor AdamW (lerp, mul + addcmul, addcdiv).
    S m = exp_avg[i];
    m += one_minus_beta1 * (g - m);
    S v = exp_avg_sq[i] * beta2;
    v += one_minus_beta2 * g * g;
    const S denom = std::sqrt(v) / bc2_sqrt + eps;
    w += neg_step_size * m / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (master) master[i] = w;
    param[i] = from_acc<T>(w); // round-to-nearest-even for bf16
  }
}

template <typename T> double sum_squares(const T* x, int64_t n) {
  constexpr int64_t kBlock = 16384;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  auto block_sum = [&](int64_t b) {
    const T* xb = x + b * kBlock;
    return lane_sum<double>(std::min(n - b * kBlock, kBlock), [&](int64_t i) {
      const double v = to_acc<double>(xb[i]);
      return v * v;
    });
  };
  if (blocks <= 1) return blocks == 1 ? block_sum(0) : 0.0;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for if (blocks > 4)
  for (int64_t b = 0; b < blocks; b++) partial[size_t(b)] = block_sum(b);
  double total = 0;
  for (double p : partial) total += p; // fixed order: deterministic for any thread count
  return total;
}

void step_guard(double* s, int64_t m, double max_norm) {
  double loss_sum = 0;
  for (int64_t i = 0; i < m; i++) loss_sum += s[i];
  const double norm_sq = s[m];
  double coef = 1.0;
  if (max_norm > 0 && std::isfinite(norm_sq))
    coef = std::min(1.0, max_norm / (std::sqrt(norm_sq) + 1e-6));
  s[m + 1] = coef;
  s[m + 2] = std::isfinite(loss_sum) && std::isfinite(norm_sq) ? 0.0 : 1.0;
}

template void adamw_step<float, float, float>(float*, float*, const float*, float*, float*, int64_t,
                                              const AdamWStepArgs&);
template void adamw_step<double, double, double>(double*, double*, const double*, double*, double*,
                                                 int64_t, const AdamWStepArgs&);
template void adamw_step<bf16, bf16, float>(bf16*, float*, const bf16*, float*, float*, int64_t,
                                            const AdamWStepArgs&);
template void adamw_step<bf16, float, float>(bf16*, float*, const float*, float*, float*, int64_t,
                                             const AdamWStepArgs&);

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);
template double sum_squares<bf16>(const bf16*, int64_t);

} // namespace vlm::kernels::cpu
