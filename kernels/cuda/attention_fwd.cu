// The flash-attention forward on CUDA (attention_fwd, declared in kernels/attention.h; semantics
// and layout as the CPU kernel kernels/cpu/attention.cpp), fp32 SIMT arithmetic on shared-memory
// tiles, with a tensor-core variant for bf16 (flash_fwd_wmma_kernel; VLM_ATTENTION_SIMT=1 makes
// bf16 use the SIMT kernel too): a block per (query tile of kBr rows of one document, query
// head); kG = 4 threads per query row, each owning every kG-th key of a tile and every kG-th
// output column. The key tiles of the document are visited in order with a running max m and
// sum l (online softmax); the output is acc / l and lse = m + log(l). Tiles: attention_tiles.cuh.
#include <mma.h>

#include "kernels/cuda/attention_common.cuh"

namespace vlm::kernels::cuda {
namespace {

using namespace attn;

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

  const int r = threadIdx.x / kG, sub = threadIdx.x % kG;
  const auto [tile, h, g, rows, q_stride, kv_stride, q_row0] = query_tile<kBr>(tiles, Hq, Hkv, D);
  const int i = tile.begin + r; // this thread's query row in the document
  const bool valid = r < rows;

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

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2; // this lane's row and half of the columns
  const auto [tile, h, g, rows, q_stride, kv_stride, q_row0] = query_tile<kB>(tiles, Hq, Hkv, D);
  const int i = tile.begin + r;
  const bool valid = r < rows;
  const int Dp = (D + 15) / 16 * 16;

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

} // namespace

template <typename T>
void attention_fwd(T* out, float* lse, const T* q, const T* k, const T* v,
                   const TileList& query_tiles, const AttentionShape& s, void* stream) {
  check_shape(s, "attention_fwd");
  if (s.tokens == 0) return;
  const FlashLauncher flash{s, static_cast<cudaStream_t>(stream)};
  by_head_dim(s.head_dim, [&](auto kd) {
    constexpr int kD = decltype(kd)::value, kB = fwd_rows<kD>();
    if constexpr (std::is_same_v<T, vlm::bf16>) {
      if (!simt_only()) {
        flash.launch<WmmaCfg<kD, kB>>("attention_fwd (tensor cores)", flash_fwd_wmma_kernel<kD, kB>,
                                      TileRows::queries, kB, query_tiles, dptr(out), lse, dptr(q),
                                      dptr(k), dptr(v));
        return;
      }
    }
    flash.launch<FwdCfg<kD, kB, kB>>("attention_fwd", flash_fwd_kernel<cuda_t<T>, kD, kB, kB>,
                                     TileRows::queries, kB, query_tiles, dptr(out), lse, dptr(q),
                                     dptr(k), dptr(v));
  });
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void attention_fwd<T>(T*, float*, const T*, const T*, const T*, const TileList&,        \
                                 const AttentionShape&, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
