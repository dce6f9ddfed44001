// The gated delta rule on the GPU in the chunked form (kernels/gated_delta.h, qwen-models.md
// §3.5-3.7), fp32 SIMT: the algorithm of kernels/cpu/gated_delta.cpp moved onto thread blocks.
//
// Grid (document, value head, group of nc value columns): the state's value columns are
// independent, so a block keeps only S[:, group] (in shared memory) and walks its document's chunks
// of 64 tokens in order. Splitting dv gives dv / nc times more blocks (4 for dv = 128, so 4·HV
// per document: 128 blocks for HV = 32 and one 8k document, about one per SM) for the price of
// recomputing the chunk's k-side work (k·k, the substitution for W) in every group; that work is
// about as large as one group's own, so a group of 32 columns costs ~2x the flops of an unsplit
// block but the chunk recurrence, which is latency-bound, runs on 4x the SMs.
//
// Inside a block, 256 threads compute each chunk's products as register tiles over operands in
// shared memory (block_product: every output summed by one thread in increasing order), and the
// triangular solves with a thread per column (columns are independent). No atomics: results are
// bitwise reproducible for a given launch shape.
//
// Backward (§3.6, as cpu::gated_delta_chunk_bwd): the forward kernel first stores the state at
// every chunk start and V' (scratch), then one block per (document, value head, column group)
// walks the chunks backwards carrying dS [dk, nc]. Everything but dv and d_initial_state is a sum
// over the value columns, so each group writes its part of dq, dk, dg, dbeta into scratch and a
// second kernel sums the groups (and, under GVA, the value heads of a k-head) in a fixed order.
// Two identities keep the chunk's dk-wide state small (with Y = Tᵀ dV'): Wᵀ dV' =
// Kᵀ diag(β e^γ) Y (W is not needed) and X = Tᵀ dW = -Y hᵀ (its products with k reduce to
// (K h)·Y), so only q, k, h and dS are dk wide.
#include "kernels/gated_delta.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/gated_delta_common.cuh"

namespace vlm::kernels::cuda {
namespace {

using gdn::check_offsets;
using gdn::Dims;
using gdn::dims_of;
using gdn::kChunk;
using gdn::Scratch;

constexpr int kBlock = 256;
constexpr int kLdC = kChunk + 1; // row stride of the [64, 64] matrices (no bank conflicts)
// Value columns per block at most: the narrow products' tiles are 32 wide.
constexpr int kMaxCols = 32;

// Row strides: q / k rows [64, ldk] are read 16 rows at a time, an odd stride spreads them over the
// banks; [rows, nc] buffers likewise.
__host__ __device__ inline int ld_k(int dk) { return dk | 1; }
__host__ __device__ inline int ld_c(int nc) { return nc + 1; }

// For every (m, n) in [0, M) x [0, N): out(m, n, Σ_{p < P} a(m, p) · b(n, p)), p increasing. The
// block's threads form a (kBlock / TX) x TX grid, each holding RM x RN outputs per tile, tiles
// walked in order; a and b are called with in-range indices only.
template <int TX, int RM, int RN, typename FA, typename FB, typename Out>
__device__ __forceinline__ void block_product(int M, int N, int P, FA a, FB b, Out out) {
  constexpr int TY = kBlock / TX;
  const int tx = int(threadIdx.x) % TX, ty = int(threadIdx.x) / TX;
  for (int m0 = 0; m0 < M; m0 += TY * RM)
    for (int n0 = 0; n0 < N; n0 += TX * RN) {
      int ms[RM], ns[RN];
#pragma unroll
      for (int r = 0; r < RM; r++) ms[r] = m0 + ty + TY * r;
#pragma unroll
      for (int c = 0; c < RN; c++) ns[c] = n0 + tx + TX * c;
      int ma[RM], na[RN]; // clamped for the reads
#pragma unroll
      for (int r = 0; r < RM; r++) ma[r] = ms[r] < M ? ms[r] : 0;
#pragma unroll
      for (int c = 0; c < RN; c++) na[c] = ns[c] < N ? ns[c] : 0;
      float acc[RM][RN];
#pragma unroll
      for (int r = 0; r < RM; r++)
#pragma unroll
        for (int c = 0; c < RN; c++) acc[r][c] = 0.f;
      for (int p = 0; p < P; p++) {
        float av[RM], bv[RN];
#pragma unroll
        for (int r = 0; r < RM; r++) av[r] = a(ma[r], p);
#pragma unroll
        for (int c = 0; c < RN; c++) bv[c] = b(na[c], p);
#pragma unroll
        for (int r = 0; r < RM; r++)
#pragma unroll
          for (int c = 0; c < RN; c++) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
      }
#pragma unroll
      for (int r = 0; r < RM; r++)
#pragma unroll
        for (int c = 0; c < RN; c++)
          if (ms[r] < M && ns[c] < N) out(ms[r], ns[c], acc[r][c]);
    }
}

// [64, 64] products (tile 64 x 64) and [rows, nc] ones (tile 64 x 32).
template <typename FA, typename FB, typename Out>
__device__ __forceinline__ void square_product(int M, int N, int P, FA a, FB b, Out out) {
  block_product<16, 4, 4>(M, N, P, a, b, out);
}
template <typename FA, typename FB, typename Out>
__device__ __forceinline__ void narrow_product(int M, int N, int P, FA a, FB b, Out out) {
  block_product<8, 2, 4>(M, N, P, a, b, out);
}

// The chunk's gates in shared memory: γ (double, the cumulative log decay from the chunk start),
// β, e^γ, e^{γ_n - γ} (zero past the chunk's n tokens) and the raw g.
struct Gates {
  double* gam;
  float *beta, *eg, *egn, *g;
  static constexpr int kFloats = 2 * kChunk + 4 * kChunk; // gam counted as two floats each
  __device__ Gates(float* base)
      : gam(reinterpret_cast<double*>(base)), beta(base + 2 * kChunk), eg(beta + kChunk),
        egn(eg + kChunk), g(egn + kChunk) {}
  // E_ij = e^{γ_i - γ_j}, the difference taken in double (as on the CPU).
  __device__ float E(int i, int j) const { return expf(float(gam[i] - gam[j])); }
};

// Loads β and g of tokens [t0, t0 + n) of value head j (threads < 64; zeros past n).
__device__ void load_gates(Gates G, const float* g, const float* beta, int t0, int n, int HV,
                           int j) {
  const int i = int(threadIdx.x);
  if (i < kChunk) {
    const int64_t gate = int64_t(t0 + i) * HV + j;
    G.g[i] = i < n ? g[gate] : 0.f;
    G.beta[i] = i < n ? beta[gate] : 0.f;
  }
}

// γ, e^γ, e^{γ_n - γ} from the loaded g (threads < 64; after a barrier following load_gates).
// Every thread sums the same g in the same order, so γ_i and γ_{n-1} agree across threads.
__device__ void finish_gates(Gates G, int n) {
  const int i = int(threadIdx.x);
  if (i >= kChunk) return;
  double gi = 0, last = 0;
  for (int x = 0; x < n; x++) {
    last += double(G.g[x]);
    if (x == i) gi = last;
  }
  G.gam[i] = gi;
  G.eg[i] = i < n ? expf(float(gi)) : 0.f;
  G.egn[i] = i < n ? expf(float(last - gi)) : 0.f;
}

// dst[i, x] = src row t0 + i (head `head` of `heads`, columns col0 + x, x < cols) for i < n, 0 for
// n <= i < 64; rows `ld` apart in dst, `dim` values per source head row.
__device__ void load_rows(float* dst, int ld, const float* src, int t0, int n, int heads, int head,
                          int dim, int col0, int cols) {
  for (int x = int(threadIdx.x); x < kChunk * cols; x += kBlock) {
    const int i = x / cols, c = x - i * cols;
    dst[i * ld + c] = i < n ? src[(int64_t(t0 + i) * heads + head) * dim + col0 + c] : 0.f;
  }
}

struct ChunkFwdArgs {
  float* out;         // [T, HV, dv] or null (the backward's forward pass)
  float* final_state; // [docs, HV, dk, dv] or null
  float* h_save;      // or null: the state at every chunk start [chunks, HV, dk, dv]
  float* vp_save;     // with h_save: V' [T, HV, dv]
  const float *q, *k, *v, *g, *beta, *initial_state;
  const int32_t* cu;        // [docs + 1]
  const int32_t* chunk_off; // [docs]: chunks of the documents before b
  int nc;                   // value columns per block
  Dims P;
};

// Shared memory of the forward kernel, in floats.
int64_t fwd_smem_floats(int dk, int nc) {
  return Gates::kFloats + 2 * int64_t(kChunk) * ld_k(dk) + int64_t(dk + kChunk) * ld_c(nc) +
         int64_t(kChunk) * kLdC;
}

// Grid (docs, HV, ceil(dv / nc)). Per chunk (cpu chunk_forward): A = β E ⊙ (k kᵀ) strictly
// lower; W = T diag(β e^γ) K and U = T diag(β) V by forward substitution; V' = U - W h;
// O = s diag(e^γ) Q h + (s E ⊙ Q Kᵀ) V' (lower with the diagonal); S <- e^{γ_n} h + K̃ᵀ V'.
__global__ void __launch_bounds__(kBlock) chunk_fwd_kernel(ChunkFwdArgs A) {
  extern __shared__ double smem_fwd[];
  const Dims P = A.P;
  const int b = int(blockIdx.x), j = int(blockIdx.y), e0 = int(blockIdx.z) * A.nc;
  const int nc = min(A.nc, P.dv - e0), dk = P.dk, dv = P.dv, hk = j / P.group;
  const int tid = int(threadIdx.x), ldk = ld_k(dk), lds = ld_c(A.nc);
  float* base = reinterpret_cast<float*>(smem_fwd);
  const Gates G(base);
  float* Ks = base + Gates::kFloats; // k rows [64, ldk]
  float* QW = Ks + kChunk * ldk;     // W rows, then q rows [64, ldk]
  float* S = QW + kChunk * ldk;      // the state's columns [dk, lds]
  float* U = S + dk * lds;           // U, then V' [64, lds]
  float* Am = U + kChunk * lds;      // A, then s E ⊙ Q Kᵀ [64, kLdC]
  const int64_t size = int64_t(dk) * dv, state0 = (int64_t(b) * P.HV + j) * size;
  for (int x = tid; x < dk * nc; x += kBlock) {
    const int d = x / nc, e = x - d * nc;
    S[d * lds + e] = A.initial_state ? A.initial_state[state0 + int64_t(d) * dv + e0 + e] : 0.f;
  }
  const int start = A.cu[b], end = A.cu[b + 1];
  for (int t0 = start, c = 0; t0 < end; t0 += kChunk, c++) {
    const int n = min(kChunk, end - t0);
    __syncthreads(); // the previous chunk is done with every buffer
    load_rows(Ks, ldk, A.k, t0, n, P.HK, hk, dk, 0, dk);
    load_rows(U, lds, A.v, t0, n, P.HV, j, dv, e0, nc);
    load_gates(G, A.g, A.beta, t0, n, P.HV, j);
    __syncthreads();
    finish_gates(G, n);
    __syncthreads();
    square_product(
        kChunk, kChunk, dk, [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int i, int x, float s) {
          Am[i * kLdC + x] = x < i && i < n ? G.beta[i] * G.E(i, x) * s : 0.f;
        });
    __syncthreads();
    // Forward substitution, a thread per column (W's dk, then U's nc): X_i = init_i - Σ A_ix X_x.
    for (int col = tid; col < dk + nc; col += kBlock) {
      const bool w = col < dk;
      float* X = w ? QW + col : U + (col - dk);
      const int ld = w ? ldk : lds;
      for (int i = 0; i < n; i++) {
        float x = w ? (G.beta[i] * G.eg[i]) * Ks[i * ldk + col] : G.beta[i] * X[i * ld];
        for (int y = 0; y < i; y++) x = fmaf(-Am[i * kLdC + y], X[y * ld], x);
        X[i * ld] = x;
      }
      if (w)
        for (int i = n; i < kChunk; i++) X[i * ld] = 0.f;
    }
    __syncthreads();
    // V' = U - W h (in place).
    narrow_product(
        kChunk, nc, dk, [&](int i, int p) { return QW[i * ldk + p]; },
        [&](int e, int p) { return S[p * lds + e]; },
        [&](int i, int e, float s) { U[i * lds + e] -= s; });
    __syncthreads();
    if (A.h_save) {
      float* h = A.h_save + (int64_t(A.chunk_off[b] + c) * P.HV + j) * size;
      for (int x = tid; x < dk * nc; x += kBlock) {
        const int d = x / nc, e = x - d * nc;
        h[int64_t(d) * dv + e0 + e] = S[d * lds + e];
      }
      for (int x = tid; x < n * nc; x += kBlock) {
        const int i = x / nc, e = x - i * nc;
        A.vp_save[(int64_t(t0 + i) * P.HV + j) * dv + e0 + e] = U[i * lds + e];
      }
    }
    if (A.out) {
      load_rows(QW, ldk, A.q, t0, n, P.HK, hk, dk, 0, dk); // W is no longer needed
      __syncthreads();
      square_product(
          kChunk, kChunk, dk, [&](int i, int p) { return QW[i * ldk + p]; },
          [&](int i, int p) { return Ks[i * ldk + p]; },
          [&](int i, int x, float s) {
            Am[i * kLdC + x] = x <= i && i < n ? (P.scale * G.E(i, x)) * s : 0.f;
          });
      __syncthreads();
      // O_i = s e^{γ_i} q_i h + Σ_{x<=i} L_ix V'_x: one sum over [Q | L] · [h ; V'].
      narrow_product(
          kChunk, nc, dk + kChunk,
          [&](int i, int p) {
            return p < dk ? (P.scale * G.eg[i]) * QW[i * ldk + p] : Am[i * kLdC + p - dk];
          },
          [&](int e, int p) { return p < dk ? S[p * lds + e] : U[(p - dk) * lds + e]; },
          [&](int i, int e, float s) {
            if (i < n) A.out[(int64_t(t0 + i) * P.HV + j) * dv + e0 + e] = s;
          });
    }
    __syncthreads(); // S is read above
    // S <- e^{γ_n} h + Σ_x e^{γ_n - γ_x} k_x V'_xᵀ (rows past n are zero).
    const float decay = G.eg[n - 1];
    narrow_product(
        dk, nc, kChunk, [&](int d, int p) { return G.egn[p] * Ks[p * ldk + d]; },
        [&](int e, int p) { return U[p * lds + e]; },
        [&](int d, int e, float s) { S[d * lds + e] = fmaf(decay, S[d * lds + e], s); });
  }
  if (A.final_state) {
    __syncthreads();
    for (int x = tid; x < dk * nc; x += kBlock) {
      const int d = x / nc, e = x - d * nc;
      A.final_state[state0 + int64_t(d) * dv + e0 + e] = S[d * lds + e];
    }
  }
}

struct ChunkBwdArgs {
  float *dq_part, *dk_part;    // [T, HV, groups, dk]: this group's part of the head's dq / dk
  float *dg_part, *dbeta_part; // [T, HV, groups]
  float *dv, *d_initial_state; // (the latter may be null)
  const float *h_save, *vp_save, *dout, *q, *k, *v, *g, *beta;
  const int32_t *cu, *chunk_off;
  int nc, groups;
  Dims P;
};

int64_t bwd_smem_floats(int dk, int nc) {
  return Gates::kFloats + 2 * kChunk + kBlock + 2 * int64_t(kChunk) * ld_k(dk) +
         int64_t(2 * dk + 7 * kChunk) * ld_c(nc) + 3 * int64_t(kChunk) * kLdC;
}

// Grid (docs, HV, groups). Per chunk, last first, with dS = the gradient of the state at the
// chunk end (cpu backward_values / backward_keys / backward_wy, see the file comment):
//   EK = E ⊙ k kᵀ (strictly lower), L = s E ⊙ q kᵀ, dL = dO V'ᵀ (lower with the diagonal);
//   dV' = Lᵀ dO + diag(e^{γ_n - γ}) K dS; Y = Tᵀ dV' (backward substitution); dv = β Y;
//   B = s E ⊙ dL; dA = -Y V'ᵀ (strictly lower); M_ci = β_c E_ci dA_ci (i < c), β_i E_ic dA_ic
//   (i > c);
//   dq = s diag(e^γ) dO hᵀ + B K;
//   dk = Bᵀ Q + M K + diag(e^{γ_n - γ}) V' dSᵀ - diag(β e^γ) Y hᵀ;
//   dγ, dβ per token from row sums; dS <- e^{γ_n} dS + s Qᵀ diag(e^γ) dO - Kᵀ diag(β e^γ) Y.
__global__ void __launch_bounds__(kBlock) chunk_bwd_kernel(ChunkBwdArgs A) {
  extern __shared__ double smem_bwd[];
  const Dims P = A.P;
  const int b = int(blockIdx.x), j = int(blockIdx.y), grp = int(blockIdx.z), e0 = grp * A.nc;
  const int nc = min(A.nc, P.dv - e0), dk = P.dk, dv = P.dv, hk = j / P.group;
  const int tid = int(threadIdx.x), ldk = ld_k(dk), lds = ld_c(A.nc);
  const float scale = P.scale;
  float* base = reinterpret_cast<float*>(smem_bwd);
  const Gates G(base);
  float* dgam = base + Gates::kFloats; // dL/dγ per token
  float* dbeta = dgam + kChunk;
  float* red = dbeta + kChunk;    // [kBlock] partial sums of ⟨dS, h⟩
  float* Qs = red + kBlock;       // [64, ldk]
  float* Ks = Qs + kChunk * ldk;  // [64, ldk]
  float* H = Ks + kChunk * ldk;   // h [dk, lds]
  float* dS = H + dk * lds;       // [dk, lds]
  float* Vp = dS + dk * lds;      // V' [64, lds]
  float* dO = Vp + kChunk * lds;  // [64, lds]
  float* Vv = dO + kChunk * lds;  // v [64, lds]
  float* Qh = Vv + kChunk * lds;  // Q h [64, lds]
  float* Kh = Qh + kChunk * lds;  // K h [64, lds]
  float* KdS = Kh + kChunk * lds; // K dS [64, lds]
  float* Y = KdS + kChunk * lds;  // dV', then Y [64, lds]
  float* EK = Y + kChunk * lds;   // [64, kLdC]
  float* LG = EK + kChunk * kLdC; // L, then dA, then M [64, kLdC]
  float* B = LG + kChunk * kLdC;  // dL, then B [64, kLdC]
  const int64_t size = int64_t(dk) * dv, state0 = (int64_t(b) * P.HV + j) * size;
  for (int x = tid; x < dk * nc; x += kBlock) dS[(x / nc) * lds + x % nc] = 0.f;
  const int start = A.cu[b], end = A.cu[b + 1];
  const int chunks = (end - start + kChunk - 1) / kChunk;
  for (int c = chunks - 1; c >= 0; c--) {
    const int t0 = start + c * kChunk, n = min(kChunk, end - t0), last = n - 1;
    __syncthreads(); // the previous chunk is done with every buffer
    load_rows(Qs, ldk, A.q, t0, n, P.HK, hk, dk, 0, dk);
    load_rows(Ks, ldk, A.k, t0, n, P.HK, hk, dk, 0, dk);
    load_rows(Vp, lds, A.vp_save, t0, n, P.HV, j, dv, e0, nc);
    load_rows(dO, lds, A.dout, t0, n, P.HV, j, dv, e0, nc);
    load_rows(Vv, lds, A.v, t0, n, P.HV, j, dv, e0, nc);
    const float* h = A.h_save + (int64_t(A.chunk_off[b] + c) * P.HV + j) * size;
    for (int x = tid; x < dk * nc; x += kBlock) {
      const int d = x / nc, e = x - d * nc;
      H[d * lds + e] = h[int64_t(d) * dv + e0 + e];
    }
    load_gates(G, A.g, A.beta, t0, n, P.HV, j);
    __syncthreads();
    finish_gates(G, n);
    __syncthreads();
    // The chunk's products (independent of one another).
    square_product(
        kChunk, kChunk, dk, [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int i, int x, float s) { EK[i * kLdC + x] = x < i && i < n ? G.E(i, x) * s : 0.f; });
    square_product(
        kChunk, kChunk, dk, [&](int i, int p) { return Qs[i * ldk + p]; },
        [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int i, int x, float s) {
          LG[i * kLdC + x] = x <= i && i < n ? (scale * G.E(i, x)) * s : 0.f;
        });
    square_product(
        kChunk, kChunk, nc, [&](int i, int p) { return dO[i * lds + p]; },
        [&](int i, int p) { return Vp[i * lds + p]; },
        [&](int i, int x, float s) { B[i * kLdC + x] = x <= i && i < n ? s : 0.f; });
    narrow_product(
        kChunk, nc, dk, [&](int i, int p) { return Qs[i * ldk + p]; },
        [&](int e, int p) { return H[p * lds + e]; },
        [&](int i, int e, float s) { Qh[i * lds + e] = s; });
    narrow_product(
        kChunk, nc, dk, [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int e, int p) { return H[p * lds + e]; },
        [&](int i, int e, float s) { Kh[i * lds + e] = s; });
    narrow_product(
        kChunk, nc, dk, [&](int i, int p) { return Ks[i * ldk + p]; },
        [&](int e, int p) { return dS[p * lds + e]; },
        [&](int i, int e, float s) { KdS[i * lds + e] = s; });
    __syncthreads();
    // dV'_x = Σ_{i>=x} L_ix dO_i + e^{γ_n - γ_x} (K dS)_x (into Y).
    narrow_product(
        kChunk, nc, kChunk, [&](int x, int p) { return LG[p * kLdC + x]; },
        [&](int e, int p) { return dO[p * lds + e]; },
        [&](int x, int e, float s) { Y[x * lds + e] = fmaf(G.egn[x], KdS[x * lds + e], s); });
    // P = L ⊙ dL (= B ⊙ q kᵀ): dγ_i = Σ_x P_ix - Σ_r P_ri (the first terms).
    if (tid < n) {
      float row = 0.f, col = 0.f;
      for (int x = 0; x <= tid; x++) row += LG[tid * kLdC + x] * B[tid * kLdC + x];
      for (int r = tid; r < n; r++) col += LG[r * kLdC + tid] * B[r * kLdC + tid];
      dgam[tid] = row - col;
    }
    __syncthreads();
    // Y = Tᵀ dV', a thread per column: Y_i = dV'_i - Σ_{x>i} β_x EK_xi Y_x. Meanwhile B = s E ⊙ dL.
    for (int e = tid; e < nc; e += kBlock)
      for (int i = n - 1; i >= 0; i--) {
        float y = Y[i * lds + e];
        for (int x = i + 1; x < n; x++)
          y = fmaf(-(G.beta[x] * EK[x * kLdC + i]), Y[x * lds + e], y);
        Y[i * lds + e] = y;
      }
    for (int x = tid; x < kChunk * kChunk; x += kBlock) {
      const int i = x / kChunk, y = x - i * kChunk;
      if (y <= i && i < n) B[i * kLdC + y] *= scale * G.E(i, y);
    }
    __syncthreads();
    // dA_ix = -Y_i·V'_x (x < i), into LG (L is no longer needed).
    square_product(
        kChunk, kChunk, nc, [&](int i, int p) { return Y[i * lds + p]; },
        [&](int i, int p) { return Vp[i * lds + p]; },
        [&](int i, int x, float s) { LG[i * kLdC + x] = x < i && i < n ? -s : 0.f; });
    // Per token: dv = β Y; dβ = v·Y + e^γ k·X; dγ += s e^γ q·(h dO) + β e^γ k·X - k·(e^{γ_n-γ} dS
    // V') with k·X = -(K h)·Y; the state's term for γ_n is summed below (in `Gates::g`, now free).
    if (tid < n) {
      const int i = tid;
      float vy = 0.f, ky = 0.f, qo = 0.f, kv = 0.f;
      for (int e = 0; e < nc; e++) {
        vy += Vv[i * lds + e] * Y[i * lds + e];
        ky += Kh[i * lds + e] * Y[i * lds + e];
        qo += Qh[i * lds + e] * dO[i * lds + e];
        kv += KdS[i * lds + e] * Vp[i * lds + e];
      }
      const float tx = -ky, ts = G.egn[i] * kv;
      dbeta[i] = vy + G.eg[i] * tx;
      dgam[i] += (scale * G.eg[i]) * qo + (G.beta[i] * G.eg[i]) * tx - ts;
      G.g[i] = ts;
    }
    for (int x = tid; x < n * nc; x += kBlock) {
      const int i = x / nc, e = x - i * nc;
      A.dv[(int64_t(t0 + i) * P.HV + j) * dv + e0 + e] = G.beta[i] * Y[i * lds + e];
    }
    float part = 0.f;
    for (int x = tid; x < dk * nc; x += kBlock) {
      const int d = x / nc, e = x - d * nc;
      part += dS[d * lds + e] * H[d * lds + e];
    }
    red[tid] = part;
    __syncthreads();
    // Through A = β E ⊙ k kᵀ: dγ_i += Σ_x dA_ix A_ix - Σ_r dA_ri A_ri; dβ_i += Σ_x dA_ix EK_ix.
    if (tid < n) {
      const int i = tid;
      float rb = 0.f, cg = 0.f;
      for (int x = 0; x < i; x++) rb += LG[i * kLdC + x] * EK[i * kLdC + x];
      for (int r = i + 1; r < n; r++) cg += G.beta[r] * (LG[r * kLdC + i] * EK[r * kLdC + i]);
      dgam[i] += G.beta[i] * rb - cg;
      dbeta[i] += rb;
    }
    // M's upper part M_xi = β_i E_ix dA_ix (i > x), from dA's lower part.
    for (int z = tid; z < kChunk * kChunk; z += kBlock) {
      const int x = z / kChunk, i = z - x * kChunk;
      if (i > x) LG[x * kLdC + i] = i < n ? G.beta[i] * G.E(i, x) * LG[i * kLdC + x] : 0.f;
    }
    __syncthreads();
    // M's lower part in place: M_ix = β_i E_ix dA_ix (x < i).
    for (int z = tid; z < kChunk * kChunk; z += kBlock) {
      const int i = z / kChunk, x = z - i * kChunk;
      if (x < i && i < n) LG[i * kLdC + x] *= G.beta[i] * G.E(i, x);
    }
    // γ_n's terms: Σ_x e^{γ_n - γ_x} k_x·(dS V'_x) and e^{γ_n} ⟨dS, h⟩.
    if (tid == 0) {
      float sum = 0.f, ts = 0.f;
      for (int x = 0; x < kBlock; x++) sum += red[x];
      for (int x = 0; x < n; x++) ts += G.g[x];
      dgam[last] += ts + G.eg[last] * sum;
    }
    __syncthreads();
    // This group's dq and dk rows: sums over [dO | B] · [hᵀ ; K] and [Bᵀ | M | V' | Y] ·
    // [Q ; K ; dSᵀ ; hᵀ] with the row scalings folded into the left operand.
    float* dq_rows = A.dq_part + (int64_t(t0) * P.HV + j) * A.groups * dk + int64_t(grp) * dk;
    float* dk_rows = A.dk_part + (int64_t(t0) * P.HV + j) * A.groups * dk + int64_t(grp) * dk;
    const int64_t row_ld = int64_t(P.HV) * A.groups * dk; // one token further
    square_product(
        kChunk, dk, nc + kChunk,
        [&](int i, int p) {
          return p < nc ? (scale * G.eg[i]) * dO[i * lds + p] : B[i * kLdC + p - nc];
        },
        [&](int d, int p) { return p < nc ? H[d * lds + p] : Ks[(p - nc) * ldk + d]; },
        [&](int i, int d, float s) {
          if (i < n) dq_rows[i * row_ld + d] = s;
        });
    square_product(
        kChunk, dk, 2 * kChunk + 2 * nc,
        [&](int x, int p) {
          if (p < kChunk) return B[p * kLdC + x];
          if (p < 2 * kChunk) return LG[x * kLdC + p - kChunk];
          if (p < 2 * kChunk + nc) return G.egn[x] * Vp[x * lds + p - 2 * kChunk];
          return -(G.beta[x] * G.eg[x]) * Y[x * lds + p - 2 * kChunk - nc];
        },
        [&](int d, int p) {
          if (p < kChunk) return Qs[p * ldk + d];
          if (p < 2 * kChunk) return Ks[(p - kChunk) * ldk + d];
          if (p < 2 * kChunk + nc) return dS[d * lds + p - 2 * kChunk];
          return H[d * lds + p - 2 * kChunk - nc];
        },
        [&](int x, int d, float s) {
          if (x < n) dk_rows[x * row_ld + d] = s;
        });
    __syncthreads();
    // dS <- e^{γ_n} dS + Σ_i (s e^{γ_i} q_i) dO_iᵀ - Σ_i (β_i e^{γ_i} k_i) Y_iᵀ (= Wᵀ dV').
    const float decay = G.eg[last];
    narrow_product(
        dk, nc, 2 * kChunk,
        [&](int d, int p) {
          return p < kChunk ? (scale * G.eg[p]) * Qs[p * ldk + d]
                            : -(G.beta[p - kChunk] * G.eg[p - kChunk]) * Ks[(p - kChunk) * ldk + d];
        },
        [&](int e, int p) { return p < kChunk ? dO[p * lds + e] : Y[(p - kChunk) * lds + e]; },
        [&](int d, int e, float s) { dS[d * lds + e] = fmaf(decay, dS[d * lds + e], s); });
    // dg_t = Σ_{i >= t} dγ_i (γ is the cumulative sum of g).
    if (tid < n) {
      float acc = 0.f;
      for (int i = last; i >= tid; i--) acc += dgam[i];
      const int64_t at = (int64_t(t0 + tid) * P.HV + j) * A.groups + grp;
      A.dg_part[at] = acc;
      A.dbeta_part[at] = dbeta[tid];
    }
  }
  if (A.d_initial_state) {
    __syncthreads();
    for (int x = tid; x < dk * nc; x += kBlock) {
      const int d = x / nc, e = x - d * nc;
      A.d_initial_state[state0 + int64_t(d) * dv + e0 + e] = dS[d * lds + e];
    }
  }
}

// The widest column group (<= kMaxCols, halving) whose shared memory fits the device.
template <typename Floats> int columns_for(int dk, int dv, Floats floats, const char* op) {
  const int64_t limit = gdn::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  int nc = std::min(kMaxCols, dv);
  while (nc > 1 && floats(dk, nc) * int64_t(sizeof(float)) > limit) nc = (nc + 1) / 2;
  VLM_CHECK(floats(dk, nc) * int64_t(sizeof(float)) <= limit, op, ": dk=", dk,
            " needs more shared memory than the device's ", limit, " bytes");
  VLM_CHECK((dv + nc - 1) / nc <= 64, op, ": dv=", dv, " in groups of ", nc,
            " columns exceeds the grid's 64 groups");
  return nc;
}

template <typename Kernel> void allow_large_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    VLM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

void launch_fwd(ChunkFwdArgs A, int docs, cudaStream_t st, const char* op) {
  A.nc = columns_for(A.P.dk, A.P.dv, fwd_smem_floats, op);
  const size_t smem = size_t(fwd_smem_floats(A.P.dk, A.nc)) * sizeof(float);
  allow_large_smem(chunk_fwd_kernel, smem);
  const dim3 grid(unsigned(docs), unsigned(A.P.HV), unsigned((A.P.dv + A.nc - 1) / A.nc));
  chunk_fwd_kernel<<<grid, kBlock, smem, st>>>(A);
  check_last_launch(op);
}

} // namespace

void gated_delta_chunk_fwd(float* out, float* final_state, const float* q, const float* k,
                           const float* v, const float* g, const float* beta,
                           const float* initial_state, const VarlenOffsets& offsets,
                           const GatedDeltaShape& shape, void* stream) {
  const char* op = "gated_delta_chunk_fwd";
  const Dims P = dims_of(shape, op);
  check_offsets(offsets, shape, op);
  if (shape.tokens == 0 && !final_state) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int docs = int(shape.docs);
  ChunkFwdArgs A{};
  A.out = out;
  A.final_state = final_state;
  A.q = q;
  A.k = k;
  A.v = v;
  A.g = g;
  A.beta = beta;
  A.initial_state = initial_state;
  A.cu = offsets.cu_seqlens;
  A.chunk_off = offsets.chunk_starts;
  A.P = P;
  launch_fwd(A, docs, st, op);
}

void gated_delta_chunk_bwd(float* dq, float* dk, float* dv, float* dg, float* dbeta,
                           float* d_initial_state, const float* dout, const float* q,
                           const float* k, const float* v, const float* g, const float* beta,
                           const float* initial_state, const VarlenOffsets& offsets,
                           const GatedDeltaShape& shape, void* stream) {
  const char* op = "gated_delta_chunk_bwd";
  const Dims P = dims_of(shape, op);
  check_offsets(offsets, shape, op);
  if (shape.tokens == 0 && !d_initial_state) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int docs = int(shape.docs);
  const int64_t T = shape.tokens, size = int64_t(P.dk) * P.dv;
  // The forward pass: the state at every chunk start and V'.
  Scratch h_save(size_t(offsets.chunks * P.HV * size) * sizeof(float), st);
  Scratch vp_save(size_t(T * P.HV * P.dv) * sizeof(float), st);
  ChunkFwdArgs F{};
  F.h_save = h_save.as<float>();
  F.vp_save = vp_save.as<float>();
  F.q = q;
  F.k = k;
  F.v = v;
  F.g = g;
  F.beta = beta;
  F.initial_state = initial_state;
  F.cu = offsets.cu_seqlens;
  F.chunk_off = offsets.chunk_starts;
  F.P = P;
  if (T > 0) launch_fwd(F, docs, st, op);
  // The chunks backwards, each column group writing its parts of dq, dk, dg, dbeta.
  ChunkBwdArgs A{};
  A.nc = columns_for(P.dk, P.dv, bwd_smem_floats, op);
  A.groups = (P.dv + A.nc - 1) / A.nc;
  Scratch dq_part(size_t(T * P.HV * A.groups * P.dk) * sizeof(float), st);
  Scratch dk_part(size_t(T * P.HV * A.groups * P.dk) * sizeof(float), st);
  Scratch dg_part(size_t(T * P.HV * A.groups) * sizeof(float), st);
  Scratch dbeta_part(size_t(T * P.HV * A.groups) * sizeof(float), st);
  A.dq_part = dq_part.as<float>();
  A.dk_part = dk_part.as<float>();
  A.dg_part = dg_part.as<float>();
  A.dbeta_part = dbeta_part.as<float>();
  A.dv = dv;
  A.d_initial_state = d_initial_state;
  A.h_save = h_save.as<float>();
  A.vp_save = vp_save.as<float>();
  A.dout = dout;
  A.q = q;
  A.k = k;
  A.v = v;
  A.g = g;
  A.beta = beta;
  A.cu = offsets.cu_seqlens;
  A.chunk_off = offsets.chunk_starts;
  A.P = P;
  const size_t smem = size_t(bwd_smem_floats(P.dk, A.nc)) * sizeof(float);
  allow_large_smem(chunk_bwd_kernel, smem);
  chunk_bwd_kernel<<<dim3(unsigned(docs), unsigned(P.HV), unsigned(A.groups)), kBlock, smem, st>>>(
      A);
  check_last_launch(op);
  // dq, dk: the k-head's value heads then the column groups, in order; dg, dbeta: the groups.
  const int64_t k_rows = T * P.HK, v_rows = T * P.HV;
  gdn::sum_heads(dq, A.dq_part, k_rows, P.group * A.groups, P.dk, st, op);
  gdn::sum_heads(dk, A.dk_part, k_rows, P.group * A.groups, P.dk, st, op);
  gdn::sum_heads(dg, A.dg_part, v_rows, A.groups, 1, st, op);
  gdn::sum_heads(dbeta, A.dbeta_part, v_rows, A.groups, 1, st, op);
}

} // namespace vlm::kernels::cuda
