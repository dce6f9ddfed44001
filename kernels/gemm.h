// Row-major GEMM: C[M,N] = alpha * op(A) op(B) + beta * C, where A is [M,K] ([K,M] when trans_a)
// and B is [K,N] ([N,K] when trans_b), all contiguous row-major; `batch` matrices at the given
// element strides. beta = 1 accumulates (parameter gradients). CPU through OpenBLAS, CUDA through
// cuBLASLt (kernels/cuda/gemm.cu).
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
// bf16 A and B, f32 C (read when beta != 0, written unrounded): the weight gradient of a bf16
// parameter accumulated straight into its fp32 .grad (beta = 1).
void gemm_bf16_f32(float* c, const bf16* a, const bf16* b, const GemmShape& s, float alpha = 1.f,
                   float beta = 0.f);

} // namespace vlm::kernels::cpu

// GPU version (kernels/cuda/gemm.cu): the same product through cuBLASLt, type-erased.
namespace vlm::kernels::cuda {

enum class GemmType { f32, bf16 };

// Row-major, batched: for each b < batch,
//   C_b[M,N] = alpha * op(A_b) op(B_b) + beta * C_b
// where A_b is [M,K] row-major ([K,M] when trans_a), B_b is [K,N] ([N,K] when trans_b), C_b is
// [M,N], each contiguous, and X_b starts at X + b * stride_x elements (a stride of 0 broadcasts
// one matrix over the batch). Accumulation is always fp32 (no TF32 for f32 inputs).
// Supported types (ab_type -> c_type): f32 -> f32, bf16 -> bf16, bf16 -> f32.
// `stream` is a cudaStream_t (nullptr: legacy default stream) of the current device, where the
// pointers live. The call is asynchronous. When beta == 0, C is not read (it may hold NaNs).
void gemm(void* c, GemmType c_type, const void* a, const void* b, GemmType ab_type, int64_t M,
          int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta, int64_t batch,
          int64_t stride_a, int64_t stride_b, int64_t stride_c, void* stream);

// gemm keeps a cuBLASLt handle and a 32 MiB workspace per (current device, stream). Call this
// before destroying a stream (vlm::Stream does): it waits for the stream and frees them, so a new
// stream that happens to get the same address cannot share a workspace still in use. No-op if
// unknown.
void gemm_release_stream(void* stream);

} // namespace vlm::kernels::cuda
