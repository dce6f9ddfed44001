// GEMM on the GPU through cuBLASLt. Plain C++ header (no CUDA includes); see kernels/cuda/gemm.cu.
#pragma once

#include <cstdint>

namespace vlm::kernels::cuda {

enum class GemmType { f32, bf16 };

// Row-major, batched: for each b < batch,
//   C_b[M,N] = alpha * op(A_b) op(B_b) + beta * C_b
// where A_b is [M,K] row-major ([K,M] when trans_a), B_b is [K,N] ([N,K] when trans_b), C_b is
// [M,N], each contiguous, and X_b starts at X + b * stride_x elements (a stride of 0 broadcasts
// one matrix over the batch). Accumulation is always fp32 (no TF32 for f32 inputs).
// Supported types (ab_type -> c_type): f32 -> f32, bf16 -> bf16, bf16 -> f32.
// `stream` is a cudaStream_t (nullptr: legacy default stream); pointers are on the current device.
// The call is asynchronous. When beta == 0, C is not read (it may hold NaNs).
void gemm(void* c, GemmType c_type, const void* a, const void* b, GemmType ab_type, int64_t M,
          int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta, int64_t batch,
          int64_t stride_a, int64_t stride_b, int64_t stride_c, void* stream);

// gemm keeps a cuBLASLt handle and a 32 MiB workspace per (current device, stream). Call this
// before destroying a stream: it waits for the stream and frees them, so a new stream that
// happens to get the same address cannot share a workspace still in use. No-op if unknown.
void gemm_release_stream(void* stream);

} // namespace vlm::kernels::cuda
