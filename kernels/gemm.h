// Row-major GEMM: C[M,N] = alpha * op(A) op(B) + beta * C, where A is [M,K] ([K,M] when trans_a)
// and B is [K,N] ([N,K] when trans_b), all contiguous row-major; `batch` matrices at the given
// element strides. beta = 1 accumulates (parameter gradients).
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0; // elements between batch matrices
};

// f32 and f64 through OpenBLAS; bf16 converted to f32, multiplied, rounded back.
template <typename T>
void gemm(T* c, const T* a, const T* b, const GemmShape& s, float alpha = 1.f, float beta = 0.f);
template <> void gemm<float>(float*, const float*, const float*, const GemmShape&, float, float);
template <>
void gemm<double>(double*, const double*, const double*, const GemmShape&, float, float);
template <> void gemm<bf16>(bf16*, const bf16*, const bf16*, const GemmShape&, float, float);

} // namespace vlm::kernels::cpu
