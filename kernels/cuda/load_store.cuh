// Device helpers shared by the row-wise kernels (norm, rope, index, loss, optim): storage-type
// mapping (vlm::bf16 -> __nv_bfloat16), fp32 loads/stores with round-to-nearest-even and vector
// loads/stores over launch.cuh's packs, and a grid-size helper. For .cu files under kernels/cuda
// only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "src/base/dtype.h"

namespace vlm::kernels::cuda::ldst {

// The CUDA type with vlm::bf16's bit layout.
template <typename T> struct cuda_type { using type = T; };
template <> struct cuda_type<vlm::bf16> { using type = __nv_bfloat16; };
template <typename T> using cuda_t = typename cuda_type<T>::type;

template <typename T> cuda_t<T>* dptr(T* p) { return reinterpret_cast<cuda_t<T>*>(p); }
template <typename T> const cuda_t<T>* dptr(const T* p) {
  return reinterpret_cast<const cuda_t<T>*>(p);
}

using dev::aligned16;
using dev::as_stream;
using dev::Pack;

// fp32 load / store of a float or __nv_bfloat16 (stores round to nearest even).
template <typename T> __device__ __forceinline__ float ld(const T* p) { return dev::to_f32(*p); }
template <typename T> __device__ __forceinline__ void st(T* p, float v) {
  *p = dev::from_f32<T>(v);
}

// v rounded to T and widened again (identity for float): a T-valued intermediate.
template <typename T> __device__ __forceinline__ float round_to(float v) {
  if constexpr (sizeof(T) == 2) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return v;
  }
}

// V consecutive elements as one aligned load/store (V * sizeof(T) == 16 for the vector path).
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, int64_t i, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = ld(p + i);
  } else {
    Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(p + i);
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = ld(&pk.v[k]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, int64_t i, const float (&in)[V]) {
  if constexpr (V == 1) {
    st(p + i, in[0]);
  } else {
    Pack<T, V> pk;
#pragma unroll
    for (int k = 0; k < V; k++) st(&pk.v[k], in[k]);
    *reinterpret_cast<Pack<T, V>*>(p + i) = pk;
  }
}

// Blocks for a grid-stride loop over `n` items of `per_block` each (at least 1, at most `cap`).
inline unsigned grid_blocks(int64_t n, int64_t per_block, int64_t cap = int64_t(1) << 20) {
  int64_t b = (n + per_block - 1) / per_block;
  return unsigned(std::max<int64_t>(1, std::min(b, cap)));
}

} // namespace vlm::kernels::cuda::ldst
