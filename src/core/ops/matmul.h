// Matrix products on BLAS (CPU) / cuBLASLt (CUDA).
#pragma once

#include "src/core/tensor.h"

namespace vlm {

// a: [..., M, K]; b: [K, N] (shared by every batch) or [..., K, N] with a's batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x w^T + bias. x: [..., in]; w: [out, in] (HF/PyTorch layout); bias: [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// y (already computed as linear(x, w, bias), e.g. kept by selective activation checkpointing)
// recorded as linear's output: the returned tensor has linear()'s backward, no GEMM is run.
Tensor linear_from_output(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y);

// Selective activation checkpointing (parallel/ac/activation_checkpointing.h) reroutes linear()
// while a checkpointed block runs: the interceptor installed on the current thread receives every
// linear() call instead, with itself uninstalled while it runs (so it may call linear()).
class LinearInterceptor {
public:
  virtual ~LinearInterceptor() = default;
  virtual Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) = 0;
};
// Installs `interceptor` (nullptr: none) for the current thread until the scope ends.
class LinearInterceptScope {
public:
  explicit LinearInterceptScope(LinearInterceptor* interceptor);
  ~LinearInterceptScope();
  LinearInterceptScope(const LinearInterceptScope&) = delete;
  LinearInterceptScope& operator=(const LinearInterceptScope&) = delete;

private:
  LinearInterceptor* previous_;
};

} // namespace vlm
