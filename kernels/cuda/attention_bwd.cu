// The flash-attention backward on CUDA (attention_bwd, declared in kernels/attention.h), fp32
// SIMT arithmetic on shared-memory tiles, with tensor-core variants for bf16 (*_wmma_kernel;
// VLM_ATTENTION_SIMT=1 makes bf16 use the SIMT kernels too): delta = rowsum(dO ⊙ O) per (token,
// query head); then a block per (key tile, kv head) with kG = 8 threads per key accumulates dK and
// dV in registers over the query heads of its group and the query tiles that see its keys (P and
// dS recomputed into shared memory), and a block per (query tile, query head) computes dQ the
// same way as the forward. Each gradient element is written once by one thread: no atomics,
// deterministic. Tiles: attention_tiles.cuh.
#include <mma.h>

#include "kernels/cuda/attention_common.cuh"

namespace vlm::kernels::cuda {
namespace {

using namespace attn;

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

  const int r = threadIdx.x / kG, sub = threadIdx.x % kG;
  const auto [tile, h, g, rows, q_stride, kv_stride, q_row0] = query_tile<kBr>(tiles, Hq, Hkv, D);
  const int i = tile.begin + r;
  const bool valid = r < rows;
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

  const int j = threadIdx.x / kG, sub = threadIdx.x % kG;
  const auto [tile, g, group, keys, q_stride, kv_stride, kv_row0] =
      key_tile<kBc>(tiles, Hq, Hkv, D);
  const bool valid = j < keys;
  const int key = tile.begin + j; // this thread's key row in the document

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
      load_row_stats<kBr>(sLse, sDelta, lse, delta, q_row0, rows, Hq);
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

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j = warp * 16 + lane / 2, half = lane % 2; // this lane's key row, column half
  const auto [tile, g, group, keys, q_stride, kv_stride, kv_row0] = key_tile<kB>(tiles, Hq, Hkv, D);
  const int key = tile.begin + j;
  const bool valid = j < keys;
  const int Dp = (D + 15) / 16 * 16;

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
      load_row_stats<kBq>(sLse, sDelta, lse, delta, q_row0, rows, Hq);
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

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const auto [tile, h, g, rows, q_stride, kv_stride, q_row0] = query_tile<kB>(tiles, Hq, Hkv, D);
  const int i = tile.begin + r;
  const bool valid = r < rows;
  const int Dp = (D + 15) / 16 * 16;
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
} // namespace

template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const float* lse, const TileList& key_tiles,
                   const TileList& query_tiles, const AttentionShape& s, void* stream) {
  check_shape(s, "attention_bwd");
  if (s.tokens == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const FlashLauncher flash{s, st};
  const int64_t n_rows = s.tokens * s.q_heads;
  float* delta = static_cast<float*>(malloc_async(size_t(n_rows) * sizeof(float), st));
  {
    const int blocks = int(std::min<int64_t>((n_rows + 7) / 8, 65536));
    delta_kernel<<<blocks, 256, 0, st>>>(delta, dptr(dout), dptr(out), n_rows, int(s.head_dim));
    check_last_launch("attention_bwd (delta)");
  }
  by_head_dim(s.head_dim, [&](auto kd) {
    constexpr int kD = decltype(kd)::value, kB = fwd_rows<kD>(), kKv = 32;
    if constexpr (std::is_same_v<T, vlm::bf16>) {
      if (!simt_only()) {
        flash.launch<WmmaDkvCfg<kD, kB, 32>>("attention_bwd (dk, dv; tensor cores)",
                                             flash_dkv_wmma_kernel<kD, kB, 32>, TileRows::keys, kB,
                                             key_tiles, dptr(dk), dptr(dv), dptr(dout), dptr(q),
                                             dptr(k), dptr(v), lse, delta);
        flash.launch<WmmaDqCfg<kD, kB, kB>>(
            "attention_bwd (dq; tensor cores)", flash_dq_wmma_kernel<kD, kB, kB>, TileRows::queries,
            kB, query_tiles, dptr(dq), dptr(dout), dptr(q), dptr(k), dptr(v), lse, delta);
        return;
      }
    }
    flash.launch<DkvCfg<kD, kKv, kKv>>(
        "attention_bwd (dk, dv)", flash_dkv_kernel<cuda_t<T>, kD, kKv, kKv>, TileRows::keys, kKv,
        key_tiles, dptr(dk), dptr(dv), dptr(dout), dptr(q), dptr(k), dptr(v), lse, delta);
    flash.launch<DqCfg<kD, kB, kB>>("attention_bwd (dq)", flash_dq_kernel<cuda_t<T>, kD, kB, kB>,
                                    TileRows::queries, kB, query_tiles, dptr(dq), dptr(dout),
                                    dptr(q), dptr(k), dptr(v), lse, delta);
  });
  free_async(delta, st);
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void attention_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,     \
                                 const float*, const TileList&, const TileList&,                   \
                                 const AttentionShape&, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
