// Optimizer kernels: the fused AdamW update and the blocked sum of squares behind global-norm
// gradient clipping.
#pragma once

#include <cstdint>

namespace vlm::kernels {

// Per-step scalars of one AdamW update, computed on the host in double (as torch.optim.AdamW
// does with Python floats) and rounded once to the state type inside the kernel.
struct AdamWStepArgs {
  double lr = 0;                    // learning rate of this parameter's group at this step
  double beta1 = 0.9;               // first-moment decay
  double beta2 = 0.999;             // second-moment decay
  double eps = 1e-8;                // added after sqrt(v_hat)
  double weight_decay = 0;          // decoupled: p -= lr * weight_decay * p
  double step_size = 0;             // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1; // sqrt(1 - beta2^t)
};

namespace cpu {

// One AdamW step for n elements (all arrays contiguous, updated in place):
//   w  = master ? master : param          (S = acc_t<T>: float for f32/bf16, double for f64)
//   w *= 1 - lr * weight_decay
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   w -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
//   param = round_to_nearest_even(w)       (only when master is given)
// T is the parameter type, G the gradient type (the parameter type, or f32 for gradients reduced
// in f32 for a bf16 parameter). master must be given exactly when T is narrower than S.
// Element-wise, so the result does not depend on the number of threads.
template <typename T, typename G, typename S>
void adamw_step(T* param, S* master, const G* grad, S* exp_avg, S* exp_avg_sq, int64_t n,
                const AdamWStepArgs& args);

// Returns sum(x[i]^2) accumulated in double over fixed blocks, the block partials added in
// order: bit-identical for any number of threads.
template <typename T> double sum_squares(const T* x, int64_t n);

} // namespace cpu
} // namespace vlm::kernels
