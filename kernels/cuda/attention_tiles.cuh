// Shared by the attention kernels (attention_fwd.cu, attention_bwd.cu, attention_ref.cu):
// shared-memory tile loads and row-group reductions of the flash kernels, the launch helpers. For
// .cu files under kernels/cuda only.
//
// Tiles never cross documents; the tile lists (kernels/attention_tiles.h: document start, document
// length, first row; heaviest first) are built on the host and reach the launchers already on the
// device. Rows and columns past the end of a document are zero-filled in shared memory and masked.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda::attn {

// Types and conversions shared with the other kernels (load_store.cuh, launch.cuh).
using dev::from_f32;
using dev::to_f32;
using ldst::cuda_t;
using ldst::dptr;

using kernels::Tile;

// Sums a value over the kG consecutive lanes of a row group (all lanes of the warp take part).
template <int kG> __device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = 1; o < kG; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
template <int kG> __device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int o = 1; o < kG; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// dst[r * ld + d] = src[r * stride + d] as float for r < rows, d < D; zero for the other rows
// of the tile (r < kRows). Consecutive threads read consecutive d: coalesced.
template <int kRows, typename T>
__device__ __forceinline__ void load_tile(float* dst, int ld, const T* src, int64_t stride,
                                          int rows, int D) {
  for (int e = threadIdx.x; e < kRows * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    dst[r * ld + d] = r < rows ? to_f32(src[r * stride + d]) : 0.f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int D) {
  float s = 0.f;
#pragma unroll 8
  for (int d = 0; d < D; d++) s += a[d] * b[d];
  return s;
}

// dst[r * ld + d] = src[r * stride + d] for r < rows, d < D; zero elsewhere in [kRows, Dp).
__device__ __forceinline__ void load_tile_bf16(__nv_bfloat16* dst, int ld, const __nv_bfloat16* src,
                                               int64_t stride, int rows, int D, int Dp, int kRows) {
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
  for (int e = threadIdx.x; e < kRows * Dp; e += blockDim.x) {
    const int r = e / Dp, d = e - r * Dp;
    dst[r * ld + d] = r < rows && d < D ? src[r * stride + d] : zero;
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

inline void check_shape(const AttentionShape& s, const char* op) {
  VLM_CHECK(s.tokens >= 0 && s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0 &&
                s.head_dim > 0 && s.docs >= 1,
            op, ": bad shape T=", s.tokens, " Hq=", s.q_heads, " Hkv=", s.kv_heads,
            " D=", s.head_dim, " B=", s.docs);
  VLM_CHECK(s.head_dim <= 256, op, ": head_dim ", s.head_dim, " > 256 is not supported on CUDA");
  VLM_CHECK(s.q_heads <= 65535, op, ": ", s.q_heads, " query heads exceed the grid's y limit");
  VLM_CHECK(s.tokens <= INT32_MAX, op, ": ", s.tokens, " tokens exceed int32 offsets");
}

template <typename Kernel> void allow_smem(Kernel kernel, size_t bytes) {
  VLM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Calls f(std::integral_constant<int, kD>) for the head-dim bucket of D.
template <typename F> void by_head_dim(int64_t D, F&& f) {
  if (D <= 64)
    f(std::integral_constant<int, 64>());
  else if (D <= 128)
    f(std::integral_constant<int, 128>());
  else
    f(std::integral_constant<int, 256>());
}
// VLM_ATTENTION_SIMT=1: bf16 runs the fp32 SIMT kernels instead of tensor cores.
inline bool simt_only() { return attention_simt_only(); }

// Tile rows per head-dim bucket (shared memory grows with kD); flash_query_rows (the tile lists'
// rows, kernels/cpu/attention_tiles.cpp) gives the same for every D of the bucket.
template <int kD> constexpr int fwd_rows() { return kD <= 128 ? 64 : 32; }

} // namespace vlm::kernels::cuda::attn
