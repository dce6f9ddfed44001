// Varlen softmax attention on CUDA (declared in kernels/attention.h; semantics and layout as the
// CPU kernel kernels/cpu/attention.cpp).
//
// Flash kernels (attention_fwd / attention_bwd), fp32 SIMT arithmetic on shared-memory tiles
// (bf16 has tensor-core variants of all three, *_wmma_kernel below, with the same structure;
// VLM_ATTENTION_SIMT=1 makes bf16 use the SIMT kernels too):
//  - forward: a block per (query tile of kBr rows of one document, query head); kG = 4 threads
//    per query row, each owning every kG-th key of a tile and every kG-th output column. The key
//    tiles of the document are visited in order with a running max m and sum l (online softmax);
//    the output is acc / l and lse = m + log(l).
//  - backward: delta = rowsum(dO ⊙ O) per (token, query head); then a block per (key tile, kv
//    head) with kG = 8 threads per key accumulates dK and dV in registers over the query heads of
//    its group and the query tiles that see its keys (P and dS recomputed into shared memory),
//    and a block per (query tile, query head) computes dQ the same way as the forward. Each
//    gradient element is written once by one thread: no atomics, deterministic.
// Tiles never cross documents; the host builds the list of tiles from cu_seqlens (each tile:
// document start, document length, first row) with the heaviest tiles first, and uploads it.
// Rows and columns past the end of a document are zero-filled in shared memory and masked.
//
// Reference kernels (attention_ref_*): a thread per query row (or key row) that finds its
// document by binary search in cu_seqlens, with the CPU kernel's two-pass softmax; tests only.
#include "kernels/attention.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

// Types and conversions shared with the other kernels (load_store.cuh, launch.cuh).
using dev::from_f32;
using dev::to_f32;
using ldst::cuda_t;
using ldst::dptr;

struct Tile {
  int32_t start; // first token of the document
  int32_t len;   // tokens in the document
  int32_t begin; // first row of the tile, relative to the document start
};

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

// ------------------------------------------------------------------------------------------------
// Forward. kD: the head-dim bucket (D <= kD), kBr query rows, kBc keys per tile.

template <int kD, int kBr, int kBc> struct FwdCfg {
  static constexpr int kG = 4, kThreads = kBr * kG, kP = kD + 1, kPS = kBc + 1;
  static constexpr size_t smem =
      sizeof(float) * (size_t(kBr) * kP + 2 * size_t(kBc) * kP + size_t(kBr) * kPS);
};

template <typename T, int kD, int kBr, int kBc>
__global__ void __launch_bounds__(kBr * 4)
    flash_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                     const T* __restrict__ k, const T* __restrict__ v, const Tile* tiles, int Hq,
                     int Hkv, int D, float scale, bool causal) {
  using C = FwdCfg<kD, kBr, kBc>;
  constexpr int kG = C::kG, kP = C::kP, kPS = C::kPS;
  static_assert(C::kThreads == kBr * 4, "__launch_bounds__ above");
  extern __shared__ float smem[];
  float* sQ = smem;          // [kBr][kP]
  float* sK = sQ + kBr * kP; // [kBc][kP]
  float* sV = sK + kBc * kP; // [kBc][kP]
  float* sP = sV + kBc * kP; // [kBr][kPS]

  const Tile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int r = threadIdx.x / kG, sub = threadIdx.x % kG;
  const int rows = min(kBr, tile.len - tile.begin);
  const int i = tile.begin + r; // this thread's query row in the document
  const bool valid = r < rows;
  const int64_t q_stride = int64_t(Hq) * D, kv_stride = int64_t(Hkv) * D;
  const int64_t q_row0 = (int64_t(tile.start) + tile.begin) * Hq + h; // (token, head) of row 0

  load_tile<kBr>(sQ, kP, q + q_row0 * D, q_stride, rows, D);

  const int n_keys = causal ? tile.begin + rows : tile.len;
  float m = -INFINITY, l = 0.f;
  float acc[kD / kG];
#pragma unroll
  for (int c = 0; c < kD / kG; c++) acc[c] = 0.f;

  for (int kb = 0; kb < n_keys; kb += kBc) {
    const int cols = min(kBc, n_keys - kb);
    __syncthreads(); // the previous tile's sK/sV/sP are no longer read
    const int64_t kv0 = (int64_t(tile.start) + kb) * Hkv + g;
    load_tile<kBc>(sK, kP, k + kv0 * D, kv_stride, cols, D);
    load_tile<kBc>(sV, kP, v + kv0 * D, kv_stride, cols, D);
    __syncthreads();

    float s[kBc / kG];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kBc / kG; c++) {
      const int j = sub + kG * c;
      const bool visible = valid && j < cols && (!causal || kb + j <= i);
      s[c] = visible ? scale * dot(sQ + r * kP, sK + j * kP, D) : -INFINITY;
      tile_max = fmaxf(tile_max, s[c]);
    }
    tile_max = group_max<kG>(tile_max);
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.f : m_new; // rows with nothing visible yet
    const float alpha = expf(m - m_use);                  // 0 while m is -inf
    float p_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kBc / kG; c++) {
      const float p = expf(s[c] - m_use);
      sP[r * kPS + sub + kG * c] = p;
      p_sum += p;
    }
    p_sum = group_sum<kG>(p_sum);
    l = l * alpha + p_sum;
    m = m_new;
    __syncwarp(); // a row's kG threads share one warp and read each other's sP entries
#pragma unroll
    for (int c = 0; c < kD / kG; c++) acc[c] *= alpha;
    for (int j = 0; j < cols; j++) {
      const float p = sP[r * kPS + j];
#pragma unroll
      for (int c = 0; c < kD / kG; c++) {
        const int d = sub + kG * c;
        if (d < D) acc[c] += p * sV[j * kP + d];
      }
    }
  }

  if (!valid) return;
  const int64_t row = q_row0 + int64_t(r) * Hq;
  const float inv = 1.f / l;
#pragma unroll
  for (int c = 0; c < kD / kG; c++) {
    const int d = sub + kG * c;
    if (d < D) out[row * D + d] = from_f32<T>(acc[c] * inv);
  }
  if (sub == 0) lse[row] = m + logf(l);
}

// ------------------------------------------------------------------------------------------------
// Forward on tensor cores (bf16 only): the same online softmax with S = Q K^T and O += P V as
// 16x16x16 wmma products (bf16 in, fp32 accumulate). Each warp owns 16 query rows; two lanes
// per row run the softmax on the fp32 scores in shared memory, write P rounded to bf16 (as
// flash attention does; the running sum l adds the fp32 p) and rescale the fp32 output rows,
// which live in shared memory between the products. Head dims are zero-padded to a multiple of
// 16 (72 -> 80). Fragments are only touched through load/store/mma, never element by element.

template <int kD, int kB> struct WmmaCfg {
  static constexpr int kWarps = kB / 16, kThreads = kWarps * 32;
  static constexpr int kLdh = kD + 8; // bf16 tiles Q, K, V (multiple of 8 elements)
  static constexpr int kLdS = kB + 4; // fp32 scores (multiple of 4)
  static constexpr int kLdP = kB + 8; // bf16 probabilities
  static constexpr int kLdO = kD + 4; // fp32 output accumulator
  static constexpr size_t round(size_t b) { return (b + 127) / 128 * 128; }
  static constexpr size_t q_off = 0, q_bytes = round(size_t(kB) * kLdh * 2);
  static constexpr size_t k_off = q_off + q_bytes, v_off = k_off + q_bytes;
  static constexpr size_t s_off = v_off + q_bytes, s_bytes = round(size_t(kB) * kLdS * 4);
  static constexpr size_t p_off = s_off + s_bytes, p_bytes = round(size_t(kB) * kLdP * 2);
  static constexpr size_t o_off = p_off + p_bytes, o_bytes = round(size_t(kB) * kLdO * 4);
  static constexpr size_t smem = o_off + o_bytes;
};

// dst[r * ld + d] = src[r * stride + d] for r < rows, d < D; zero elsewhere in [kRows, Dp).
__device__ __forceinline__ void load_tile_bf16(__nv_bfloat16* dst, int ld, const __nv_bfloat16* src,
                                               int64_t stride, int rows, int D, int Dp, int kRows) {
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
  for (int e = threadIdx.x; e < kRows * Dp; e += blockDim.x) {
    const int r = e / Dp, d = e - r * Dp;
    dst[r * ld + d] = r < rows && d < D ? src[r * stride + d] : zero;
  }
}

template <int kD, int kB>
__global__ void __launch_bounds__(kB * 2)
    flash_fwd_wmma_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                          const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                          const __nv_bfloat16* __restrict__ v, const Tile* tiles, int Hq, int Hkv,
                          int D, float scale, bool causal) {
  namespace wmma = nvcuda::wmma;
  using C = WmmaCfg<kD, kB>;
  static_assert(C::kThreads == kB * 2, "__launch_bounds__ above");
  constexpr int kLdh = C::kLdh, kLdS = C::kLdS, kLdP = C::kLdP, kLdO = C::kLdO;
  extern __shared__ __align__(128) unsigned char wmma_smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::q_off); // [kB][kLdh]
  auto* sK = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::k_off); // [kB][kLdh]
  auto* sV = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::v_off); // [kB][kLdh]
  auto* sS = reinterpret_cast<float*>(wmma_smem + C::s_off);         // [kB][kLdS]
  auto* sP = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::p_off); // [kB][kLdP]
  auto* sO = reinterpret_cast<float*>(wmma_smem + C::o_off);         // [kB][kLdO]

  const Tile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2; // this lane's row and half of the columns
  const int rows = min(kB, tile.len - tile.begin);
  const int i = tile.begin + r;
  const bool valid = r < rows;
  const int Dp = (D + 15) / 16 * 16;
  const int64_t q_stride = int64_t(Hq) * D, kv_stride = int64_t(Hkv) * D;
  const int64_t q_row0 = (int64_t(tile.start) + tile.begin) * Hq + h;

  load_tile_bf16(sQ, kLdh, q + q_row0 * D, q_stride, rows, D, Dp, kB);
  for (int e = threadIdx.x; e < kB * kLdO; e += blockDim.x) sO[e] = 0.f;

  const int n_keys = causal ? tile.begin + rows : tile.len;
  float m = -INFINITY, l = 0.f;
  for (int kb = 0; kb < n_keys; kb += kB) {
    const int cols = min(kB, n_keys - kb);
    __syncthreads(); // sK/sV of the previous tile are no longer read; sQ/sO initialized
    const int64_t kv0 = (int64_t(tile.start) + kb) * Hkv + g;
    load_tile_bf16(sK, kLdh, k + kv0 * D, kv_stride, cols, D, Dp, kB);
    load_tile_bf16(sV, kLdh, v + kv0 * D, kv_stride, cols, D, Dp, kB);
    __syncthreads();

    // S[16 rows of this warp][kB] = Q K^T.
    for (int n = 0; n < kB / 16; n++) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < Dp / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, sQ + warp * 16 * kLdh + kk * 16, kLdh);
        wmma::load_matrix_sync(b, sK + n * 16 * kLdh + kk * 16, kLdh); // K^T: column-major
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sS + warp * 16 * kLdS + n * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's half row; P rounded to bf16; O rows rescaled.
    constexpr int kHalf = kB / 2;
    float tile_max = -INFINITY;
    for (int c = 0; c < kHalf; c++) {
      const int j = half * kHalf + c;
      const bool visible = valid && j < cols && (!causal || kb + j <= i);
      const float s = visible ? scale * sS[r * kLdS + j] : -INFINITY;
      sS[r * kLdS + j] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = expf(m - m_use);
    float p_sum = 0.f;
    for (int c = 0; c < kHalf; c++) {
      const int j = half * kHalf + c;
      const float p = expf(sS[r * kLdS + j] - m_use);
      sP[r * kLdP + j] = __float2bfloat16_rn(p);
      p_sum += p;
    }
    p_sum += __shfl_xor_sync(0xffffffffu, p_sum, 1);
    l = l * alpha + p_sum;
    m = m_new;
    for (int d = half; d < Dp; d += 2) sO[r * kLdO + d] *= alpha;
    __syncwarp();

    // O[16 rows][Dp] += P V.
    for (int n = 0; n < Dp / 16; n++) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, sO + warp * 16 * kLdO + n * 16, kLdO, wmma::mem_row_major);
      for (int kk = 0; kk < kB / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, sP + warp * 16 * kLdP + kk * 16, kLdP);
        wmma::load_matrix_sync(b, sV + kk * 16 * kLdh + n * 16, kLdh);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sO + warp * 16 * kLdO + n * 16, acc, kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (!valid) return;
  const int64_t row = q_row0 + int64_t(r) * Hq;
  const float inv = 1.f / l;
  for (int d = half; d < D; d += 2) out[row * D + d] = __float2bfloat16_rn(sO[r * kLdO + d] * inv);
  if (half == 0) lse[row] = m + logf(l);
}

// ------------------------------------------------------------------------------------------------
// Backward.

// delta[row] = sum_d dO[row, d] * O[row, d]: one warp per (token, query head) row.
template <typename T>
__global__ void delta_kernel(float* __restrict__ delta, const T* __restrict__ dout,
                             const T* __restrict__ out, int64_t n_rows, int D) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < n_rows;
       row += warps) {
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s += to_f32(dout[row * D + d]) * to_f32(out[row * D + d]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[row] = s;
  }
}

// dQ: as the forward, with dS = P ⊙ (dO V^T - delta) in place of P and K in place of V.
template <int kD, int kBr, int kBc> struct DqCfg {
  static constexpr int kG = 4, kThreads = kBr * kG, kP = kD + 1, kPS = kBc + 1;
  static constexpr size_t smem =
      sizeof(float) * (2 * size_t(kBr) * kP + 2 * size_t(kBc) * kP + size_t(kBr) * kPS);
};

template <typename T, int kD, int kBr, int kBc>
__global__ void __launch_bounds__(kBr * 4)
    flash_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ lse,
                    const float* __restrict__ delta, const Tile* tiles, int Hq, int Hkv, int D,
                    float scale, bool causal) {
  using C = DqCfg<kD, kBr, kBc>;
  constexpr int kG = C::kG, kP = C::kP, kPS = C::kPS;
  static_assert(C::kThreads == kBr * 4, "__launch_bounds__ above");
  extern __shared__ float smem[];
  float* sQ = smem;           // [kBr][kP]
  float* sdO = sQ + kBr * kP; // [kBr][kP]
  float* sK = sdO + kBr * kP; // [kBc][kP]
  float* sV = sK + kBc * kP;  // [kBc][kP]
  float* sdS = sV + kBc * kP; // [kBr][kPS]

  const Tile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int r = threadIdx.x / kG, sub = threadIdx.x % kG;
  const int rows = min(kBr, tile.len - tile.begin);
  const int i = tile.begin + r;
  const bool valid = r < rows;
  const int64_t q_stride = int64_t(Hq) * D, kv_stride = int64_t(Hkv) * D;
  const int64_t q_row0 = (int64_t(tile.start) + tile.begin) * Hq + h;
  const int64_t row = q_row0 + int64_t(r) * Hq;
  const float row_lse = valid ? lse[row] : 0.f, row_delta = valid ? delta[row] : 0.f;

  load_tile<kBr>(sQ, kP, q + q_row0 * D, q_stride, rows, D);
  load_tile<kBr>(sdO, kP, dout + q_row0 * D, q_stride, rows, D);

  const int n_keys = causal ? tile.begin + rows : tile.len;
  float acc[kD / kG];
#pragma unroll
  for (int c = 0; c < kD / kG; c++) acc[c] = 0.f;

  for (int kb = 0; kb < n_keys; kb += kBc) {
    const int cols = min(kBc, n_keys - kb);
    __syncthreads();
    const int64_t kv0 = (int64_t(tile.start) + kb) * Hkv + g;
    load_tile<kBc>(sK, kP, k + kv0 * D, kv_stride, cols, D);
    load_tile<kBc>(sV, kP, v + kv0 * D, kv_stride, cols, D);
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kBc / kG; c++) {
      const int j = sub + kG * c;
      const bool visible = valid && j < cols && (!causal || kb + j <= i);
      float ds = 0.f;
      if (visible) {
        const float p = expf(scale * dot(sQ + r * kP, sK + j * kP, D) - row_lse);
        ds = p * (dot(sdO + r * kP, sV + j * kP, D) - row_delta);
      }
      sdS[r * kPS + j] = ds;
    }
    __syncwarp();
    for (int j = 0; j < cols; j++) {
      const float ds = sdS[r * kPS + j];
#pragma unroll
      for (int c = 0; c < kD / kG; c++) {
        const int d = sub + kG * c;
        if (d < D) acc[c] += ds * sK[j * kP + d];
      }
    }
  }

  if (!valid) return;
#pragma unroll
  for (int c = 0; c < kD / kG; c++) {
    const int d = sub + kG * c;
    if (d < D) dq[row * D + d] = from_f32<T>(scale * acc[c]);
  }
}

// dK, dV: a block per (key tile of kBc keys, kv head), kG threads per key.
template <int kD, int kBr, int kBc> struct DkvCfg {
  static constexpr int kG = 8, kThreads = kBc * kG, kP = kD + 1, kPS = kBc + 1;
  static constexpr size_t smem = sizeof(float) * (2 * size_t(kBc) * kP + 2 * size_t(kBr) * kP +
                                                  2 * size_t(kBr) * kPS + 2 * size_t(kBr));
};

template <typename T, int kD, int kBr, int kBc>
__global__ void __launch_bounds__(kBc * 8)
    flash_dkv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ dout,
                     const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const float* __restrict__ lse, const float* __restrict__ delta,
                     const Tile* tiles, int Hq, int Hkv, int D, float scale, bool causal) {
  using C = DkvCfg<kD, kBr, kBc>;
  constexpr int kG = C::kG, kP = C::kP, kPS = C::kPS;
  static_assert(C::kThreads == kBc * 8, "__launch_bounds__ above");
  extern __shared__ float smem[];
  float* sK = smem;              // [kBc][kP]
  float* sV = sK + kBc * kP;     // [kBc][kP]
  float* sQ = sV + kBc * kP;     // [kBr][kP]
  float* sdO = sQ + kBr * kP;    // [kBr][kP]
  float* sP = sdO + kBr * kP;    // [kBr][kPS]
  float* sdS = sP + kBr * kPS;   // [kBr][kPS]
  float* sLse = sdS + kBr * kPS; // [kBr]
  float* sDelta = sLse + kBr;    // [kBr]

  const Tile tile = tiles[blockIdx.x];
  const int g = blockIdx.y, group = Hq / Hkv;
  const int j = threadIdx.x / kG, sub = threadIdx.x % kG;
  const int keys = min(kBc, tile.len - tile.begin);
  const bool valid = j < keys;
  const int key = tile.begin + j; // this thread's key row in the document
  const int64_t q_stride = int64_t(Hq) * D, kv_stride = int64_t(Hkv) * D;
  const int64_t kv_row0 = (int64_t(tile.start) + tile.begin) * Hkv + g;

  load_tile<kBc>(sK, kP, k + kv_row0 * D, kv_stride, keys, D);
  load_tile<kBc>(sV, kP, v + kv_row0 * D, kv_stride, keys, D);

  float dk_acc[kD / kG], dv_acc[kD / kG];
#pragma unroll
  for (int c = 0; c < kD / kG; c++) dk_acc[c] = dv_acc[c] = 0.f;

  const int q_first = causal ? tile.begin : 0; // earlier queries see none of these keys
  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int qb = q_first; qb < tile.len; qb += kBr) {
      const int rows = min(kBr, tile.len - qb);
      const int64_t q_row0 = (int64_t(tile.start) + qb) * Hq + h;
      __syncthreads();
      load_tile<kBr>(sQ, kP, q + q_row0 * D, q_stride, rows, D);
      load_tile<kBr>(sdO, kP, dout + q_row0 * D, q_stride, rows, D);
      for (int e = threadIdx.x; e < kBr; e += blockDim.x) {
        sLse[e] = e < rows ? lse[q_row0 + int64_t(e) * Hq] : 0.f;
        sDelta[e] = e < rows ? delta[q_row0 + int64_t(e) * Hq] : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < kBr / kG; c++) {
        const int ii = sub + kG * c; // query row qb + ii
        const bool visible = valid && ii < rows && (!causal || key <= qb + ii);
        float p = 0.f, ds = 0.f;
        if (visible) {
          p = expf(scale * dot(sQ + ii * kP, sK + j * kP, D) - sLse[ii]);
          ds = p * (dot(sdO + ii * kP, sV + j * kP, D) - sDelta[ii]);
        }
        sP[ii * kPS + j] = p;
        sdS[ii * kPS + j] = ds;
      }
      __syncwarp(); // a key's kG threads share one warp
      for (int ii = 0; ii < rows; ii++) {
        const float p = sP[ii * kPS + j], ds = sdS[ii * kPS + j];
#pragma unroll
        for (int c = 0; c < kD / kG; c++) {
          const int d = sub + kG * c;
          if (d < D) {
            dv_acc[c] += p * sdO[ii * kP + d];
            dk_acc[c] += ds * sQ[ii * kP + d];
          }
        }
      }
    }
  }

  if (!valid) return;
  const int64_t at = (kv_row0 + int64_t(j) * Hkv) * D;
#pragma unroll
  for (int c = 0; c < kD / kG; c++) {
    const int d = sub + kG * c;
    if (d < D) {
      dk[at + d] = from_f32<T>(scale * dk_acc[c]);
      dv[at + d] = from_f32<T>(dv_acc[c]);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Backward on tensor cores (bf16 only), the same two passes as the SIMT kernels with every
// product a 16x16x16 wmma (bf16 in, fp32 accumulate). P and dS are recomputed in fp32 from the
// fp32 scores and rounded to bf16 only as operands of the next product (as flash attention
// does); the dK/dV and dQ accumulators stay fp32 in shared memory. Each warp owns 16 rows (keys
// in the dK/dV pass, queries in the dQ pass); lanes 2r, 2r+1 run the elementwise work of row r.

// dK, dV: a block per (kB keys, kv head); query tiles of kBq rows.
template <int kD, int kB, int kBq> struct WmmaDkvCfg {
  static constexpr int kWarps = kB / 16, kThreads = kWarps * 32;
  static constexpr int kLdh = kD + 8, kLdS = kBq + 4, kLdP = kBq + 8, kLdO = kD + 4;
  static constexpr size_t round(size_t b) { return (b + 127) / 128 * 128; }
  static constexpr size_t kv_bytes = round(size_t(kB) * kLdh * 2);
  static constexpr size_t q_bytes = round(size_t(kBq) * kLdh * 2);
  static constexpr size_t s_bytes = round(size_t(kB) * kLdS * 4);
  static constexpr size_t p_bytes = round(size_t(kB) * kLdP * 2);
  static constexpr size_t o_bytes = round(size_t(kB) * kLdO * 4);
  static constexpr size_t k_off = 0, v_off = k_off + kv_bytes, q_off = v_off + kv_bytes;
  static constexpr size_t do_off = q_off + q_bytes, s_off = do_off + q_bytes;
  static constexpr size_t dp_off = s_off + s_bytes, p_off = dp_off + s_bytes;
  static constexpr size_t ds_off = p_off + p_bytes, dk_off = ds_off + p_bytes;
  static constexpr size_t dv_off = dk_off + o_bytes, lse_off = dv_off + o_bytes;
  static constexpr size_t delta_off = lse_off + round(size_t(kBq) * 4);
  static constexpr size_t smem = delta_off + round(size_t(kBq) * 4);
};

// acc_smem[16 rows][Dp] (ld kLdO) += a_smem[16][kK] (bf16, ld lda) · b_smem[kK][Dp] (bf16,
// row-major, ld ldb), one warp.
template <int kK>
__device__ __forceinline__ void wmma_acc_rows(float* acc_smem, int ldo, const __nv_bfloat16* a_smem,
                                              int lda, const __nv_bfloat16* b_smem, int ldb,
                                              int Dp) {
  namespace wmma = nvcuda::wmma;
  for (int n = 0; n < Dp / 16; n++) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, acc_smem + n * 16, ldo, wmma::mem_row_major);
    for (int kk = 0; kk < kK / 16; kk++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
      wmma::load_matrix_sync(a, a_smem + kk * 16, lda);
      wmma::load_matrix_sync(b, b_smem + kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(acc_smem + n * 16, acc, ldo, wmma::mem_row_major);
  }
}

// out_smem[16 rows][kN] (fp32, ld lds) = a_smem[16][Dp] · b_smem[kN][Dp]^T, both bf16 row-major
// with ld ldh, one warp.
template <int kN>
__device__ __forceinline__ void wmma_abt(float* out_smem, int lds, const __nv_bfloat16* a_smem,
                                         const __nv_bfloat16* b_smem, int ldh, int Dp) {
  namespace wmma = nvcuda::wmma;
  for (int n = 0; n < kN / 16; n++) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    for (int kk = 0; kk < Dp / 16; kk++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      wmma::load_matrix_sync(a, a_smem + kk * 16, ldh);
      wmma::load_matrix_sync(b, b_smem + n * 16 * ldh + kk * 16, ldh);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(out_smem + n * 16, acc, lds, wmma::mem_row_major);
  }
}

template <int kD, int kB, int kBq>
__global__ void __launch_bounds__(kB * 2)
    flash_dkv_wmma_kernel(__nv_bfloat16* __restrict__ dk, __nv_bfloat16* __restrict__ dv,
                          const __nv_bfloat16* __restrict__ dout,
                          const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                          const __nv_bfloat16* __restrict__ v, const float* __restrict__ lse,
                          const float* __restrict__ delta, const Tile* tiles, int Hq, int Hkv,
                          int D, float scale, bool causal) {
  using C = WmmaDkvCfg<kD, kB, kBq>;
  static_assert(C::kThreads == kB * 2, "__launch_bounds__ above");
  constexpr int kLdh = C::kLdh, kLdS = C::kLdS, kLdP = C::kLdP, kLdO = C::kLdO;
  extern __shared__ __align__(128) unsigned char wmma_smem[];
  auto* sK = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::k_off);   // [kB][kLdh]
  auto* sV = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::v_off);   // [kB][kLdh]
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::q_off);   // [kBq][kLdh]
  auto* sdO = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::do_off); // [kBq][kLdh]
  auto* sS = reinterpret_cast<float*>(wmma_smem + C::s_off);           // [kB][kLdS] S^T
  auto* sdP = reinterpret_cast<float*>(wmma_smem + C::dp_off);         // [kB][kLdS] dP^T
  auto* sP = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::p_off);   // [kB][kLdP] P^T
  auto* sdS = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::ds_off); // [kB][kLdP] dS^T
  auto* sdK = reinterpret_cast<float*>(wmma_smem + C::dk_off);         // [kB][kLdO]
  auto* sdV = reinterpret_cast<float*>(wmma_smem + C::dv_off);         // [kB][kLdO]
  auto* sLse = reinterpret_cast<float*>(wmma_smem + C::lse_off);       // [kBq]
  auto* sDelta = reinterpret_cast<float*>(wmma_smem + C::delta_off);   // [kBq]

  const Tile tile = tiles[blockIdx.x];
  const int g = blockIdx.y, group = Hq / Hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j = warp * 16 + lane / 2, half = lane % 2; // this lane's key row, column half
  const int keys = min(kB, tile.len - tile.begin);
  const int key = tile.begin + j;
  const bool valid = j < keys;
  const int Dp = (D + 15) / 16 * 16;
  const int64_t q_stride = int64_t(Hq) * D, kv_stride = int64_t(Hkv) * D;
  const int64_t kv_row0 = (int64_t(tile.start) + tile.begin) * Hkv + g;

  load_tile_bf16(sK, kLdh, k + kv_row0 * D, kv_stride, keys, D, Dp, kB);
  load_tile_bf16(sV, kLdh, v + kv_row0 * D, kv_stride, keys, D, Dp, kB);
  for (int e = threadIdx.x; e < kB * kLdO; e += blockDim.x) sdK[e] = sdV[e] = 0.f;
  const int w0 = warp * 16; // first row of this warp

  const int q_first = causal ? tile.begin : 0;
  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int qb = q_first; qb < tile.len; qb += kBq) {
      const int rows = min(kBq, tile.len - qb);
      const int64_t q_row0 = (int64_t(tile.start) + qb) * Hq + h;
      __syncthreads();
      load_tile_bf16(sQ, kLdh, q + q_row0 * D, q_stride, rows, D, Dp, kBq);
      load_tile_bf16(sdO, kLdh, dout + q_row0 * D, q_stride, rows, D, Dp, kBq);
      for (int e = threadIdx.x; e < kBq; e += blockDim.x) {
        sLse[e] = e < rows ? lse[q_row0 + int64_t(e) * Hq] : 0.f;
        sDelta[e] = e < rows ? delta[q_row0 + int64_t(e) * Hq] : 0.f;
      }
      __syncthreads();
      wmma_abt<kBq>(sS + w0 * kLdS, kLdS, sK + w0 * kLdh, sQ, kLdh, Dp);   // S^T = K Q^T
      wmma_abt<kBq>(sdP + w0 * kLdS, kLdS, sV + w0 * kLdh, sdO, kLdh, Dp); // dP^T = V dO^T
      __syncwarp();
      constexpr int kHalf = kBq / 2;
      for (int c = 0; c < kHalf; c++) {
        const int ii = half * kHalf + c; // query row qb + ii
        const bool visible = valid && ii < rows && (!causal || key <= qb + ii);
        float p = 0.f, ds = 0.f;
        if (visible) {
          p = expf(scale * sS[j * kLdS + ii] - sLse[ii]);
          ds = p * (sdP[j * kLdS + ii] - sDelta[ii]);
        }
        sP[j * kLdP + ii] = __float2bfloat16_rn(p);
        sdS[j * kLdP + ii] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      wmma_acc_rows<kBq>(sdV + w0 * kLdO, kLdO, sP + w0 * kLdP, kLdP, sdO, kLdh, Dp); // P^T dO
      wmma_acc_rows<kBq>(sdK + w0 * kLdO, kLdO, sdS + w0 * kLdP, kLdP, sQ, kLdh, Dp); // dS^T Q
      __syncwarp();
    }
  }

  if (!valid) return;
  const int64_t at = (kv_row0 + int64_t(j) * Hkv) * D;
  for (int d = half; d < D; d += 2) {
    dk[at + d] = __float2bfloat16_rn(scale * sdK[j * kLdO + d]);
    dv[at + d] = __float2bfloat16_rn(sdV[j * kLdO + d]);
  }
}

// dQ: a block per (kB query rows, query head); key tiles of kBk keys.
template <int kD, int kB, int kBk> struct WmmaDqCfg {
  static constexpr int kWarps = kB / 16, kThreads = kWarps * 32;
  static constexpr int kLdh = kD + 8, kLdS = kBk + 4, kLdP = kBk + 8, kLdO = kD + 4;
  static constexpr size_t round(size_t b) { return (b + 127) / 128 * 128; }
  static constexpr size_t q_bytes = round(size_t(kB) * kLdh * 2);
  static constexpr size_t k_bytes = round(size_t(kBk) * kLdh * 2);
  static constexpr size_t s_bytes = round(size_t(kB) * kLdS * 4);
  static constexpr size_t q_off = 0, do_off = q_bytes, k_off = 2 * q_bytes;
  static constexpr size_t v_off = k_off + k_bytes, s_off = v_off + k_bytes;
  static constexpr size_t dp_off = s_off + s_bytes, ds_off = dp_off + s_bytes;
  static constexpr size_t dq_off = ds_off + round(size_t(kB) * kLdP * 2);
  static constexpr size_t smem = dq_off + round(size_t(kB) * kLdO * 4);
};

template <int kD, int kB, int kBk>
__global__ void __launch_bounds__(kB * 2)
    flash_dq_wmma_kernel(__nv_bfloat16* __restrict__ dq, const __nv_bfloat16* __restrict__ dout,
                         const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                         const __nv_bfloat16* __restrict__ v, const float* __restrict__ lse,
                         const float* __restrict__ delta, const Tile* tiles, int Hq, int Hkv, int D,
                         float scale, bool causal) {
  using C = WmmaDqCfg<kD, kB, kBk>;
  static_assert(C::kThreads == kB * 2, "__launch_bounds__ above");
  constexpr int kLdh = C::kLdh, kLdS = C::kLdS, kLdP = C::kLdP, kLdO = C::kLdO;
  extern __shared__ __align__(128) unsigned char wmma_smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::q_off);   // [kB][kLdh]
  auto* sdO = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::do_off); // [kB][kLdh]
  auto* sK = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::k_off);   // [kBk][kLdh]
  auto* sV = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::v_off);   // [kBk][kLdh]
  auto* sS = reinterpret_cast<float*>(wmma_smem + C::s_off);           // [kB][kLdS]
  auto* sdP = reinterpret_cast<float*>(wmma_smem + C::dp_off);         // [kB][kLdS]
  auto* sdS = reinterpret_cast<__nv_bfloat16*>(wmma_smem + C::ds_off); // [kB][kLdP]
  auto* sdQ = reinterpret_cast<float*>(wmma_smem + C::dq_off);         // [kB][kLdO]

  const Tile tile = tiles[blockIdx.x];
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int rows = min(kB, tile.len - tile.begin);
  const int i = tile.begin + r;
  const bool valid = r < rows;
  const int Dp = (D + 15) / 16 * 16;
  const int64_t q_stride = int64_t(Hq) * D, kv_stride = int64_t(Hkv) * D;
  const int64_t q_row0 = (int64_t(tile.start) + tile.begin) * Hq + h;
  const int64_t row = q_row0 + int64_t(r) * Hq;
  const float row_lse = valid ? lse[row] : 0.f, row_delta = valid ? delta[row] : 0.f;
  const int w0 = warp * 16;

  load_tile_bf16(sQ, kLdh, q + q_row0 * D, q_stride, rows, D, Dp, kB);
  load_tile_bf16(sdO, kLdh, dout + q_row0 * D, q_stride, rows, D, Dp, kB);
  for (int e = threadIdx.x; e < kB * kLdO; e += blockDim.x) sdQ[e] = 0.f;

  const int n_keys = causal ? tile.begin + rows : tile.len;
  for (int kb = 0; kb < n_keys; kb += kBk) {
    const int cols = min(kBk, n_keys - kb);
    __syncthreads();
    const int64_t kv0 = (int64_t(tile.start) + kb) * Hkv + g;
    load_tile_bf16(sK, kLdh, k + kv0 * D, kv_stride, cols, D, Dp, kBk);
    load_tile_bf16(sV, kLdh, v + kv0 * D, kv_stride, cols, D, Dp, kBk);
    __syncthreads();
    wmma_abt<kBk>(sS + w0 * kLdS, kLdS, sQ + w0 * kLdh, sK, kLdh, Dp);   // S = Q K^T
    wmma_abt<kBk>(sdP + w0 * kLdS, kLdS, sdO + w0 * kLdh, sV, kLdh, Dp); // dP = dO V^T
    __syncwarp();
    constexpr int kHalf = kBk / 2;
    for (int c = 0; c < kHalf; c++) {
      const int j = half * kHalf + c;
      const bool visible = valid && j < cols && (!causal || kb + j <= i);
      float ds = 0.f;
      if (visible) {
        const float p = expf(scale * sS[r * kLdS + j] - row_lse);
        ds = p * (sdP[r * kLdS + j] - row_delta);
      }
      sdS[r * kLdP + j] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    wmma_acc_rows<kBk>(sdQ + w0 * kLdO, kLdO, sdS + w0 * kLdP, kLdP, sK, kLdh, Dp); // dS K
    __syncwarp();
  }

  if (!valid) return;
  for (int d = half; d < D; d += 2)
    dq[row * D + d] = __float2bfloat16_rn(scale * sdQ[r * kLdO + d]);
}

// ------------------------------------------------------------------------------------------------
// Host side.

void check_shape(const AttentionShape& s, const char* op) {
  VLM_CHECK(s.tokens >= 0 && s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0 &&
                s.head_dim > 0 && s.docs >= 1,
            op, ": bad shape T=", s.tokens, " Hq=", s.q_heads, " Hkv=", s.kv_heads,
            " D=", s.head_dim, " B=", s.docs);
  VLM_CHECK(s.head_dim <= 256, op, ": head_dim ", s.head_dim, " > 256 is not supported on CUDA");
  VLM_CHECK(s.q_heads <= 65535, op, ": ", s.q_heads, " query heads exceed the grid's y limit");
  VLM_CHECK(s.tokens <= INT32_MAX, op, ": ", s.tokens, " tokens exceed int32 offsets");
}

// Tiles of `rows` rows over every document, heaviest first (for causal attention the work of a
// tile grows with its distance from the document start: late query tiles and early key tiles).
std::vector<Tile> make_tiles(const int32_t* cu, int64_t docs, int rows, bool causal,
                             bool late_first) {
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < docs; b++) {
    const int32_t start = cu[b], len = cu[b + 1] - cu[b];
    for (int32_t r = 0; r < len; r += rows) tiles.push_back({start, len, r});
  }
  auto work = [&](const Tile& t) -> int64_t {
    if (!causal) return t.len;
    return late_first ? int64_t(t.begin) + rows : int64_t(t.len) - t.begin;
  };
  std::stable_sort(tiles.begin(), tiles.end(),
                   [&](const Tile& a, const Tile& b) { return work(a) > work(b); });
  VLM_CHECK(tiles.size() <= size_t(INT32_MAX), "attention: too many tiles: ", tiles.size());
  return tiles;
}

// The tile list on the device, freed (stream-ordered) when it goes out of scope.
struct DeviceTiles {
  Tile* p = nullptr;
  size_t n = 0;
  cudaStream_t stream;
  DeviceTiles(const std::vector<Tile>& tiles, cudaStream_t s) : n(tiles.size()), stream(s) {
    if (n == 0) return;
    p = static_cast<Tile*>(malloc_async(n * sizeof(Tile), s));
    // From pageable memory the copy is staged before the call returns: `tiles` may go away.
    memcpy_h2d(p, tiles.data(), n * sizeof(Tile), s);
  }
  ~DeviceTiles() { free_async(p, stream); }
  DeviceTiles(const DeviceTiles&) = delete;
  DeviceTiles& operator=(const DeviceTiles&) = delete;
};

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
// VLM_ATTENTION_SIMT=1: the bf16 forward uses the fp32 SIMT kernel instead of tensor cores.
bool simt_only() {
  const char* e = std::getenv("VLM_ATTENTION_SIMT");
  return e != nullptr && e[0] == '1';
}

// Tile rows per head-dim bucket (shared memory grows with kD).
template <int kD> constexpr int fwd_rows() { return kD <= 128 ? 64 : 32; }

} // namespace

template <typename T>
void attention_fwd(T* out, float* lse, const T* q, const T* k, const T* v,
                   const int32_t* cu_seqlens_host, const AttentionShape& s, void* stream) {
  check_shape(s, "attention_fwd");
  if (s.tokens == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int D = int(s.head_dim), Hq = int(s.q_heads), Hkv = int(s.kv_heads);
  by_head_dim(D, [&](auto kd) {
    constexpr int kD = decltype(kd)::value, kB = fwd_rows<kD>();
    if constexpr (std::is_same_v<T, vlm::bf16>) {
      if (!simt_only()) {
        using C = WmmaCfg<kD, kB>;
        const DeviceTiles tiles(make_tiles(cu_seqlens_host, s.docs, kB, s.causal, true), st);
        auto kernel = flash_fwd_wmma_kernel<kD, kB>;
        allow_smem(kernel, C::smem);
        kernel<<<dim3(unsigned(tiles.n), unsigned(Hq)), C::kThreads, C::smem, st>>>(
            dptr(out), lse, dptr(q), dptr(k), dptr(v), tiles.p, Hq, Hkv, D, float(s.scale),
            s.causal);
        check_last_launch("attention_fwd (tensor cores)");
        return;
      }
    }
    using C = FwdCfg<kD, kB, kB>;
    const DeviceTiles tiles(make_tiles(cu_seqlens_host, s.docs, kB, s.causal, true), st);
    auto kernel = flash_fwd_kernel<cuda_t<T>, kD, kB, kB>;
    allow_smem(kernel, C::smem);
    kernel<<<dim3(unsigned(tiles.n), unsigned(Hq)), C::kThreads, C::smem, st>>>(
        dptr(out), lse, dptr(q), dptr(k), dptr(v), tiles.p, Hq, Hkv, D, float(s.scale), s.causal);
    check_last_launch("attention_fwd");
  });
}

template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const float* lse, const int32_t* cu_seqlens_host,
                   const AttentionShape& s, void* stream) {
  check_shape(s, "attention_bwd");
  if (s.tokens == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int D = int(s.head_dim), Hq = int(s.q_heads), Hkv = int(s.kv_heads);
  const int64_t n_rows = s.tokens * s.q_heads;
  float* delta = static_cast<float*>(malloc_async(size_t(n_rows) * sizeof(float), st));
  {
    const int blocks = int(std::min<int64_t>((n_rows + 7) / 8, 65536));
    delta_kernel<<<blocks, 256, 0, st>>>(delta, dptr(dout), dptr(out), n_rows, D);
    check_last_launch("attention_bwd (delta)");
  }
  by_head_dim(D, [&](auto kd) {
    constexpr int kD = decltype(kd)::value, kB = fwd_rows<kD>(), kKv = 32;
    if constexpr (std::is_same_v<T, vlm::bf16>) {
      if (!simt_only()) {
        {
          using C = WmmaDkvCfg<kD, kB, 32>;
          const DeviceTiles tiles(make_tiles(cu_seqlens_host, s.docs, kB, s.causal, false), st);
          auto kernel = flash_dkv_wmma_kernel<kD, kB, 32>;
          allow_smem(kernel, C::smem);
          kernel<<<dim3(unsigned(tiles.n), unsigned(Hkv)), C::kThreads, C::smem, st>>>(
              dptr(dk), dptr(dv), dptr(dout), dptr(q), dptr(k), dptr(v), lse, delta, tiles.p, Hq,
              Hkv, D, float(s.scale), s.causal);
          check_last_launch("attention_bwd (dk, dv; tensor cores)");
        }
        {
          using C = WmmaDqCfg<kD, kB, kB>;
          const DeviceTiles tiles(make_tiles(cu_seqlens_host, s.docs, kB, s.causal, true), st);
          auto kernel = flash_dq_wmma_kernel<kD, kB, kB>;
          allow_smem(kernel, C::smem);
          kernel<<<dim3(unsigned(tiles.n), unsigned(Hq)), C::kThreads, C::smem, st>>>(
              dptr(dq), dptr(dout), dptr(q), dptr(k), dptr(v), lse, delta, tiles.p, Hq, Hkv, D,
              float(s.scale), s.causal);
          check_last_launch("attention_bwd (dq; tensor cores)");
        }
        return;
      }
    }
    {
      using C = DkvCfg<kD, kKv, kKv>;
      const DeviceTiles tiles(make_tiles(cu_seqlens_host, s.docs, kKv, s.causal, false), st);
      auto kernel = flash_dkv_kernel<cuda_t<T>, kD, kKv, kKv>;
      allow_smem(kernel, C::smem);
      kernel<<<dim3(unsigned(tiles.n), unsigned(Hkv)), C::kThreads, C::smem, st>>>(
          dptr(dk), dptr(dv), dptr(dout), dptr(q), dptr(k), dptr(v), lse, delta, tiles.p, Hq, Hkv,
          D, float(s.scale), s.causal);
      check_last_launch("attention_bwd (dk, dv)");
    }
    {
      using C = DqCfg<kD, kB, kB>;
      const DeviceTiles tiles(make_tiles(cu_seqlens_host, s.docs, kB, s.causal, true), st);
      auto kernel = flash_dq_kernel<cuda_t<T>, kD, kB, kB>;
      allow_smem(kernel, C::smem);
      kernel<<<dim3(unsigned(tiles.n), unsigned(Hq)), C::kThreads, C::smem, st>>>(
          dptr(dq), dptr(dout), dptr(q), dptr(k), dptr(v), lse, delta, tiles.p, Hq, Hkv, D,
          float(s.scale), s.causal);
      check_last_launch("attention_bwd (dq)");
    }
  });
  free_async(delta, st);
}

// ------------------------------------------------------------------------------------------------
// Reference kernels.

namespace {

constexpr int kRefThreads = 64, kRefMaxD = 256;

// The document holding token t: the b with cu[b] <= t < cu[b + 1] (empty documents skipped).
__device__ int find_doc(const int32_t* cu, int docs, int64_t t) {
  int lo = 0, hi = docs - 1; // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

template <typename T> __device__ float dot_rows(const T* a, const T* b, int D) {
  float s = 0.f;
  for (int d = 0; d < D; d++) s += to_f32(a[d]) * to_f32(b[d]);
  return s;
}

template <typename T>
__global__ void ref_fwd_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                               const int32_t* cu, int docs, int64_t tokens, int Hq, int Hkv, int D,
                               float scale, bool causal) {
  const int64_t t = blockIdx.x * int64_t(kRefThreads) + threadIdx.x;
  if (t >= tokens) return;
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int b = find_doc(cu, docs, t);
  const int64_t start = cu[b], len = cu[b + 1] - start, i = t - start;
  const int64_t visible = causal ? i + 1 : len;
  const int64_t row = t * Hq + h;
  const T* qr = q + row * D;
  float m = -INFINITY;
  for (int64_t j = 0; j < visible; j++)
    m = fmaxf(m, scale * dot_rows(qr, k + ((start + j) * Hkv + g) * D, D));
  float acc[kRefMaxD];
  for (int d = 0; d < D; d++) acc[d] = 0.f;
  float denom = 0.f;
  for (int64_t j = 0; j < visible; j++) {
    const int64_t kv = ((start + j) * Hkv + g) * D;
    const float p = expf(scale * dot_rows(qr, k + kv, D) - m);
    denom += p;
    for (int d = 0; d < D; d++) acc[d] += p * to_f32(v[kv + d]);
  }
  const float inv = 1.f / denom;
  for (int d = 0; d < D; d++) out[row * D + d] = from_f32<T>(acc[d] * inv);
  lse[row] = m + logf(denom);
}

template <typename T>
__global__ void ref_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v,
                              const T* out, const float* lse, const int32_t* cu, int docs,
                              int64_t tokens, int Hq, int Hkv, int D, float scale, bool causal) {
  const int64_t t = blockIdx.x * int64_t(kRefThreads) + threadIdx.x;
  if (t >= tokens) return;
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int b = find_doc(cu, docs, t);
  const int64_t start = cu[b], len = cu[b + 1] - start, i = t - start;
  const int64_t visible = causal ? i + 1 : len;
  const int64_t row = t * Hq + h;
  const float delta = dot_rows(dout + row * D, out + row * D, D);
  float acc[kRefMaxD];
  for (int d = 0; d < D; d++) acc[d] = 0.f;
  for (int64_t j = 0; j < visible; j++) {
    const int64_t kv = ((start + j) * Hkv + g) * D;
    const float p = expf(scale * dot_rows(q + row * D, k + kv, D) - lse[row]);
    const float ds = p * (dot_rows(dout + row * D, v + kv, D) - delta);
    for (int d = 0; d < D; d++) acc[d] += ds * to_f32(k[kv + d]);
  }
  for (int d = 0; d < D; d++) dq[row * D + d] = from_f32<T>(scale * acc[d]);
}

template <typename T>
__global__ void ref_dkv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                               const T* out, const float* lse, const int32_t* cu, int docs,
                               int64_t tokens, int Hq, int Hkv, int D, float scale, bool causal) {
  const int64_t t = blockIdx.x * int64_t(kRefThreads) + threadIdx.x;
  if (t >= tokens) return;
  const int g = blockIdx.y, group = Hq / Hkv;
  const int b = find_doc(cu, docs, t);
  const int64_t start = cu[b], len = cu[b + 1] - start, j = t - start;
  const int64_t kv = (t * Hkv + g) * D;
  float dk_acc[kRefMaxD], dv_acc[kRefMaxD];
  for (int d = 0; d < D; d++) dk_acc[d] = dv_acc[d] = 0.f;
  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int64_t i = causal ? j : 0; i < len; i++) {
      const int64_t row = (start + i) * Hq + h;
      const float delta = dot_rows(dout + row * D, out + row * D, D);
      const float p = expf(scale * dot_rows(q + row * D, k + kv, D) - lse[row]);
      const float ds = p * (dot_rows(dout + row * D, v + kv, D) - delta);
      for (int d = 0; d < D; d++) {
        dv_acc[d] += p * to_f32(dout[row * D + d]);
        dk_acc[d] += ds * to_f32(q[row * D + d]);
      }
    }
  }
  for (int d = 0; d < D; d++) {
    dk[kv + d] = from_f32<T>(scale * dk_acc[d]);
    dv[kv + d] = from_f32<T>(dv_acc[d]);
  }
}

dim3 ref_grid(int64_t rows, int64_t heads) {
  return dim3(unsigned((rows + kRefThreads - 1) / kRefThreads), unsigned(heads));
}

} // namespace

template <typename T>
void attention_ref_fwd(T* out, float* lse, const T* q, const T* k, const T* v,
                       const int32_t* cu_seqlens_device, const AttentionShape& s, void* stream) {
  check_shape(s, "attention_ref_fwd");
  if (s.tokens == 0) return;
  ref_fwd_kernel<<<ref_grid(s.tokens, s.q_heads), kRefThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(
      dptr(out), lse, dptr(q), dptr(k), dptr(v), cu_seqlens_device, int(s.docs), s.tokens,
      int(s.q_heads), int(s.kv_heads), int(s.head_dim), float(s.scale), s.causal);
  check_last_launch("attention_ref_fwd");
}

template <typename T>
void attention_ref_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                       const T* out, const float* lse, const int32_t* cu_seqlens_device,
                       const AttentionShape& s, void* stream) {
  check_shape(s, "attention_ref_bwd");
  if (s.tokens == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  ref_dq_kernel<<<ref_grid(s.tokens, s.q_heads), kRefThreads, 0, st>>>(
      dptr(dq), dptr(dout), dptr(q), dptr(k), dptr(v), dptr(out), lse, cu_seqlens_device,
      int(s.docs), s.tokens, int(s.q_heads), int(s.kv_heads), int(s.head_dim), float(s.scale),
      s.causal);
  check_last_launch("attention_ref_bwd (dq)");
  ref_dkv_kernel<<<ref_grid(s.tokens, s.kv_heads), kRefThreads, 0, st>>>(
      dptr(dk), dptr(dv), dptr(dout), dptr(q), dptr(k), dptr(v), dptr(out), lse, cu_seqlens_device,
      int(s.docs), s.tokens, int(s.q_heads), int(s.kv_heads), int(s.head_dim), float(s.scale),
      s.causal);
  check_last_launch("attention_ref_bwd (dk, dv)");
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void attention_fwd<T>(T*, float*, const T*, const T*, const T*, const int32_t*,         \
                                 const AttentionShape&, void*);                                    \
  template void attention_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,     \
                                 const float*, const int32_t*, const AttentionShape&, void*);      \
  template void attention_ref_fwd<T>(T*, float*, const T*, const T*, const T*, const int32_t*,     \
                                     const AttentionShape&, void*);                                \
  template void attention_ref_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                     const float*, const int32_t*, const AttentionShape&, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
