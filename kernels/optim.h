// Optimizer kernels: the fused AdamW update, the blocked sum of squares behind global-norm
// gradient clipping (CPU: one tensor at a time; CUDA: multi-tensor, norm and clip on the device)
// and the training step's non-finite guard (the clip coefficient and AdamW's skip flag).
#pragma once

#include <cstddef>
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

// The non-finite guard of a training step, on its scalars s (f64, m + 3 values). Given s[0, m),
// the micro-batch loss sums, and s[m], the squared global gradient norm, it writes
//   s[m + 1] = the clip coefficient min(1, max_norm / (sqrt(s[m]) + 1e-6)), the arithmetic of
//              optim::clip_coefficient; 1 when max_norm <= 0 or s[m] is not finite;
//   s[m + 2] = AdamW's skip flag: 1 when s[m] or the sum of s[0, m) (added in index order, as the
//              host adds them) is not finite, else 0.
void step_guard(double* s, int64_t m, double max_norm);

} // namespace cpu

// GPU versions (kernels/cuda/optim.cu); pointers on the current device, asynchronous on `stream`.
namespace cuda {

// As cpu::adamw_step, bit for bit (the same fp32 operations in the same order, no FMA
// contraction, IEEE sqrt and division). Instantiated for (float, float, float),
// (bf16, bf16, float) and (bf16, float, float).
template <typename T, typename G, typename S>
void adamw_step(T* param, S* master, const G* grad, S* exp_avg, S* exp_avg_sq, int64_t n,
                const AdamWStepArgs& args, void* stream);

// One tensor of a multi-tensor AdamW update: T* param, G* grad (types fixed per call, see
// adamw_multi_step), fp32 state, and this tensor's own step scalars (group LR, bias corrections).
struct AdamWTensor {
  void* param = nullptr;
  float* master = nullptr; // exactly when param is bf16
  const void* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t n = 0;
  AdamWStepArgs args;
};

// adamw_step over `count` tensors (host array) in one launch: every block updates one fixed-size
// chunk of one tensor; per element exactly adamw_step's arithmetic. All tensors of a call share
// (T, G): (float, float), (bf16, bf16) or (bf16, float). The descriptors are written into
// `staging` (pinned host memory of at least adamw_multi_staging_bytes(count) bytes, which the
// caller must not reuse before the work now queued on `stream` has finished) and copied to the
// device from there (stream-ordered, no synchronization, no pageable upload). `skip` (nullable): a
// device f64 scalar read by every block; when it is nonzero the launch writes nothing
// (parameters, masters and moments stay as they are), so the host can queue the update before it
// knows whether the step is finite.
size_t adamw_multi_staging_bytes(int64_t count);
template <typename T, typename G>
void adamw_multi_step(const AdamWTensor* tensors, int64_t count, const double* skip, void* staging,
                      void* stream);

// --- multi-tensor gradient norm and clipping --------------------------------------------------
// A list of gradients handled by a handful of launches, whatever its length: the descriptor table
// (pointer, length, dtype of up to kGradSpansPerLaunch tensors) travels in the kernel parameters
// (a __grid_constant__ struct of ~26 KB, allowed since CUDA 12.1 on sm_70+), so there is no
// upload, no host buffer to keep alive and nothing to cache; a longer list takes one more launch
// per kGradSpansPerLaunch tensors. Every block task is one fixed chunk of one tensor.

// One gradient: n contiguous f32 or bf16 elements on the current device.
struct GradSpan {
  void* data = nullptr;
  int64_t n = 0;
  bool bf16 = false; // else f32
};

constexpr int64_t kGradSpansPerLaunch = 1024; // tensors per launch of the multi-tensor kernels
constexpr int64_t kGradNormChunk = 32768;     // elements per fp64 partial (one block task)

// Number of fp64 partials multi_sum_squares needs: the sum over the tensors of
// ceil(n / kGradNormChunk) (a function of the sizes only).
int64_t multi_sum_squares_num_partials(const GradSpan* tensors, int64_t count);

// out[0] (=) the sum of x^2 over every element of every tensor, in fp64 and deterministic: each
// chunk's squares summed by a fixed tree into partials[0, num_partials) (in list order), then one
// block adds the partials in a fixed order (no atomics). out[1] (=) the clip coefficient
// min(1, max_norm / (sqrt(out[0]) + 1e-6)) in fp64 (optim::clip_coefficient's arithmetic), or 1
// when max_norm <= 0 or out[0] is not finite. Both stay on the device (nothing synchronizes).
// Launches: ceil(count / kGradSpansPerLaunch) + 1.
void multi_sum_squares(double* out, double* partials, const GradSpan* tensors, int64_t count,
                       double max_norm, void* stream);

// x *= c for every element of every tensor, as scale_ does on CUDA (fp32 c = float(coef) times
// the element, rounded to nearest even for bf16). With coef_device (a device fp64 scalar, e.g.
// multi_sum_squares' out + 1) c is read on the device and nothing is written unless c < 1 (not for
// 1 or NaN); without it c = coef_host, always applied. Launches: ceil(count / kGradSpansPerLaunch).
void multi_scale(const GradSpan* tensors, int64_t count, const double* coef_device,
                 double coef_host, void* stream);

// cpu::step_guard on device memory s: one launch of one thread (m is the micro-step count).
void step_guard(double* s, int64_t m, double max_norm, void* stream);

} // namespace cuda
} // namespace vlm::kernels
