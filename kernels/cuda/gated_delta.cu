// The gated delta rule on the GPU, declared in kernels/gated_delta.h: the recurrence, token by
// token, in fp32. A correct first version (not the chunked tensor-core form).
//
// The recurrence is separable over the value columns e of S [dk, dv]: column e of the next state
// depends only on column e of the previous one (and on the token's k, g, beta and v_e). So a
// thread owns one column and walks the tokens without synchronizing; only the backward's outputs
// dq, dk (sums over the columns of a row) and dg, dbeta (sums over all of S) need the block.
//
// Backward, per (document b, value head j), with dS = dL/dS_t on entry to token t (zero after the
// last token: final_state takes no gradient), S̃ = α S_{t-1}, kS = S̃ᵀ k, δ = β (v - kS):
//   dS += s q dOᵀ                     (o = Sᵀ s q)
//   dδ = dSᵀ k;  dv = β dδ;  dβ = Σ_e dδ_e (v_e - kS_e);  w = -β dδ
//   dk = dS (β (v - kS)) + S̃ w;  dq = s S_t dO      (row sums: thread x takes row x)
//   dS += k wᵀ;  dg = ⟨dS, S̃⟩;  dS <- α dS
// in the order of cpu::gated_delta_recurrent_bwd (the reference).
#include "kernels/gated_delta.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/gated_delta_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using gdn::check_offsets;
using gdn::device_attribute;
using gdn::Dims;
using gdn::dims_of;
using gdn::kChunk;
using gdn::Scratch;

constexpr int kMaxDim = int(kGatedDeltaMaxDim);
// Value columns per forward block (one warp).
constexpr int kCols = 32;
// At most this much of per-block backward scratch at a time (the blocks beyond it wait).
constexpr size_t kSlotBudget = size_t(512) << 20;

// One token on column e of a state (element d at S[d * ld]): dst <- α src + k δ with
// δ = β (v_e - (α src)ᵀ k). dst may be src. α src is rounded before use (no FMA contraction), as
// the reference scales the state first.
__device__ __forceinline__ void step_column(float* dst, const float* src, int ld, const float* kt,
                                            float v_e, float alpha, float bt, int dk) {
  float kS = 0.f;
  for (int d = 0; d < dk; d++) kS += kt[d] * __fmul_rn(alpha, src[d * ld]);
  const float delta = bt * (v_e - kS);
  for (int d = 0; d < dk; d++) dst[d * ld] = __fmul_rn(alpha, src[d * ld]) + kt[d] * delta;
}

// Grid (docs, HV, ceil(dv / kCols)); thread = one value column; S columns in shared memory
// [dk][kCols].
__global__ void __launch_bounds__(kCols)
    fwd_kernel(float* out, float* final_state, const float* q, const float* k, const float* v,
               const float* g, const float* beta, const float* initial_state, const int32_t* cu,
               Dims P) {
  extern __shared__ float smem[];
  const int b = blockIdx.x, j = blockIdx.y, e = blockIdx.z * kCols + threadIdx.x;
  if (e >= P.dv) return; // no barriers below: every thread is on its own
  float* S = smem + threadIdx.x;
  const int64_t size = int64_t(P.dk) * P.dv, state0 = (int64_t(b) * P.HV + j) * size;
  for (int d = 0; d < P.dk; d++)
    S[d * kCols] = initial_state ? initial_state[state0 + int64_t(d) * P.dv + e] : 0.f;
  const int hk = j / P.group;
  for (int t = cu[b]; t < cu[b + 1]; t++) {
    const int64_t gate = int64_t(t) * P.HV + j;
    const float* kt = k + (int64_t(t) * P.HK + hk) * P.dk;
    const float* qt = q + (int64_t(t) * P.HK + hk) * P.dk;
    step_column(S, S, kCols, kt, v[gate * P.dv + e], expf(g[gate]), beta[gate], P.dk);
    float o = 0.f;
    for (int d = 0; d < P.dk; d++) o += (P.scale * qt[d]) * S[d * kCols];
    out[gate * P.dv + e] = o;
  }
  if (final_state)
    for (int d = 0; d < P.dk; d++) final_state[state0 + int64_t(d) * P.dv + e] = S[d * kCols];
}

struct BwdArgs {
  // dq / dk: [T, head_ld, dk] rows indexed by the value head (head_ld = HV: per-value-head
  // scratch under GVA, else the outputs themselves with HV = HK).
  float *dq, *dk, *dv, *dg, *dbeta, *d_initial_state;
  const float *dout, *q, *k, *v, *g, *beta, *initial_state;
  const int32_t* cu;        // [docs + 1] token offsets
  const int32_t* chunk_off; // [docs]: chunks of the documents before b
  float* bounds;            // the state at every chunk start: [chunks of b, HV, ...][dk, dv]
  float* slots;             // per block: (kChunk + 1) states [dk, dv], then dS unless in smem
  int64_t slot_floats;
  int docs, head_ld;
  bool ds_in_smem;
  Dims P;
};

// Block = one (document, value head) at a time (a grid-stride loop over them), blockDim =
// max(dk, dv) rounded up to a warp: thread x owns column x of S and dS, and row x of dq / dk.
__global__ void bwd_kernel(BwdArgs A) {
  extern __shared__ float dyn[];
  __shared__ float s_vk[kMaxDim], s_w[kMaxDim], s_do[kMaxDim], red[32];
  const Dims P = A.P;
  const int x = threadIdx.x;
  const bool col = x < P.dv, row = x < P.dk;
  const int64_t size = int64_t(P.dk) * P.dv;
  const int ldS = P.dv + 1; // dS [dk][dv + 1]: rows read across threads without bank conflicts
  float* states = A.slots + int64_t(blockIdx.x) * A.slot_floats; // [kChunk + 1][dk][dv]
  float* dS = A.ds_in_smem ? dyn : states + (kChunk + 1) * size;
  for (int item = blockIdx.x; item < A.docs * P.HV; item += gridDim.x) {
    const int b = item / P.HV, j = item - b * P.HV, hk = j / P.group;
    const int start = A.cu[b], end = A.cu[b + 1];
    const int chunks = (end - start + kChunk - 1) / kChunk;
    float* bounds = A.bounds + (int64_t(A.chunk_off[b]) * P.HV + int64_t(j) * chunks) * size;
    const int64_t state0 = (int64_t(b) * P.HV + j) * size;
    auto step = [&](float* dst, const float* src, int t) { // column x, token t
      const int64_t gate = int64_t(t) * P.HV + j;
      step_column(dst + x, src + x, P.dv, A.k + (int64_t(t) * P.HK + hk) * P.dk,
                  A.v[gate * P.dv + x], expf(A.g[gate]), A.beta[gate], P.dk);
    };
    // Forward: the state at every chunk start (running state in states[0]).
    if (col) {
      for (int d = 0; d < P.dk; d++)
        states[d * P.dv + x] =
            A.initial_state ? A.initial_state[state0 + int64_t(d) * P.dv + x] : 0.f;
      for (int c = 0; c < chunks; c++) {
        for (int d = 0; d < P.dk; d++) bounds[c * size + d * P.dv + x] = states[d * P.dv + x];
        for (int t = start + c * kChunk; t < min(end, start + (c + 1) * kChunk); t++)
          step(states, states, t);
      }
      for (int d = 0; d < P.dk; d++) dS[d * ldS + x] = 0.f;
    }
    // Backward over the chunks in reverse.
    for (int c = chunks - 1; c >= 0; c--) {
      const int t0 = start + c * kChunk, n = min(kChunk, end - t0);
      __syncthreads(); // the previous chunk's row reads of `states` are done
      if (col) {
        for (int d = 0; d < P.dk; d++) states[d * P.dv + x] = bounds[c * size + d * P.dv + x];
        for (int i = 0; i < n; i++) step(states + (i + 1) * size, states + i * size, t0 + i);
      }
      __syncthreads(); // rows read every column of the states
      for (int i = n - 1; i >= 0; i--) {
        const int t = t0 + i;
        const int64_t gate = int64_t(t) * P.HV + j;
        const float *Sp = states + i * size, *St = Sp + size; // before / after token t
        const float *kt = A.k + (int64_t(t) * P.HK + hk) * P.dk,
                    *qt = A.q + (int64_t(t) * P.HK + hk) * P.dk;
        const float alpha = expf(A.g[gate]), bt = A.beta[gate];
        float dbeta_part = 0.f, dg_part = 0.f;
        if (col) {
          float kS = 0.f;
          for (int d = 0; d < P.dk; d++) kS += kt[d] * __fmul_rn(alpha, Sp[d * P.dv + x]);
          const float v_e = A.v[gate * P.dv + x], do_e = A.dout[gate * P.dv + x];
          float ddelta = 0.f;
          for (int d = 0; d < P.dk; d++) {
            const float ds = dS[d * ldS + x] + (P.scale * qt[d]) * do_e;
            dS[d * ldS + x] = ds;
            ddelta += ds * kt[d];
          }
          A.dv[gate * P.dv + x] = bt * ddelta;
          dbeta_part = ddelta * (v_e - kS);
          s_vk[x] = v_e - kS;
          s_w[x] = -bt * ddelta;
          s_do[x] = do_e;
        }
        __syncthreads();
        if (row) { // d = x: sums over the columns
          float sum_delta = 0.f, sum_w = 0.f, sum_q = 0.f;
          for (int e = 0; e < P.dv; e++) {
            sum_delta += dS[x * ldS + e] * bt * s_vk[e];
            sum_w += __fmul_rn(alpha, Sp[x * P.dv + e]) * s_w[e];
            sum_q += St[x * P.dv + e] * s_do[e];
          }
          A.dq[(int64_t(t) * A.head_ld + j) * P.dk + x] = P.scale * sum_q;
          A.dk[(int64_t(t) * A.head_ld + j) * P.dk + x] = sum_delta + sum_w;
        }
        __syncthreads(); // rows have read dS
        if (col) {
          const float w = s_w[x];
          for (int d = 0; d < P.dk; d++) {
            const float ds = dS[d * ldS + x] + kt[d] * w;
            dg_part += ds * __fmul_rn(alpha, Sp[d * P.dv + x]);
            dS[d * ldS + x] = alpha * ds;
          }
        }
        const float dbeta_sum = dev::block_reduce(dbeta_part, dev::SumOp(), red);
        const float dg_sum = dev::block_reduce(dg_part, dev::SumOp(), red);
        if (x == 0) {
          A.dbeta[gate] = dbeta_sum;
          A.dg[gate] = dg_sum;
        }
      }
    }
    if (col && A.d_initial_state)
      for (int d = 0; d < P.dk; d++)
        A.d_initial_state[state0 + int64_t(d) * P.dv + x] = dS[d * ldS + x];
    __syncthreads(); // the next item reuses states and dS
  }
}

// dst[t, hk, d] = Σ_{i < group} part[t, hk · group + i, d], i in order (the GVA sum).
__global__ void sum_heads_kernel(float* dst, const float* part, int64_t rows, int group, int dk) {
  const int64_t n = rows * dk;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / dk, d = e - r * dk;
    const float* src = part + r * group * dk + d;
    float sum = src[0];
    for (int i = 1; i < group; i++) sum += src[int64_t(i) * dk];
    dst[e] = sum;
  }
}

} // namespace

void gdn::sum_heads(float* dst, const float* part, int64_t rows, int group, int dim,
                    cudaStream_t stream, const char* op) {
  if (rows == 0) return;
  sum_heads_kernel<<<dev::flat_blocks(rows * dim), dev::kThreads, 0, stream>>>(dst, part, rows,
                                                                               group, dim);
  check_last_launch(op);
}

void gated_delta_recurrent_fwd(float* out, float* final_state, const float* q, const float* k,
                               const float* v, const float* g, const float* beta,
                               const float* initial_state, const VarlenOffsets& offsets,
                               const GatedDeltaShape& shape, void* stream) {
  const Dims P = dims_of(shape, "gated_delta_recurrent_fwd");
  check_offsets(offsets, shape, "gated_delta_recurrent_fwd");
  if (shape.tokens == 0 && !final_state) return;
  cudaStream_t st = dev::as_stream(stream);
  const dim3 grid(unsigned(shape.docs), unsigned(P.HV), unsigned((P.dv + kCols - 1) / kCols));
  const size_t smem = size_t(P.dk) * kCols * sizeof(float); // <= 32 KiB
  fwd_kernel<<<grid, kCols, smem, st>>>(out, final_state, q, k, v, g, beta, initial_state,
                                        offsets.cu_seqlens, P);
  check_last_launch("gated_delta_recurrent_fwd");
}

void gated_delta_recurrent_bwd(float* dq, float* dk, float* dv, float* dg, float* dbeta,
                               float* d_initial_state, const float* dout, const float* q,
                               const float* k, const float* v, const float* g, const float* beta,
                               const float* initial_state, const VarlenOffsets& offsets,
                               const GatedDeltaShape& shape, void* stream) {
  const Dims P = dims_of(shape, "gated_delta_recurrent_bwd");
  check_offsets(offsets, shape, "gated_delta_recurrent_bwd");
  if (shape.tokens == 0 && !d_initial_state) return;
  cudaStream_t st = dev::as_stream(stream);
  const int docs = int(shape.docs);
  const int64_t chunk_total = offsets.chunks;

  const int64_t size = int64_t(P.dk) * P.dv;
  const size_t ds_bytes = size_t(P.dk) * (P.dv + 1) * sizeof(float);
  const size_t static_smem = (3 * kMaxDim + 32) * sizeof(float);
  const bool ds_in_smem =
      ds_bytes + static_smem <= size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  const int64_t slot_floats = (kChunk + 1) * size + (ds_in_smem ? 0 : int64_t(ds_bytes / 4));
  const int64_t items = int64_t(docs) * P.HV;
  const int64_t by_budget =
      std::max<int64_t>(1, int64_t(kSlotBudget / (size_t(slot_floats) * sizeof(float))));
  const int64_t slots =
      std::min({items, by_budget, 2 * int64_t(device_attribute(cudaDevAttrMultiProcessorCount))});
  Scratch bounds(size_t(chunk_total * P.HV * size) * sizeof(float), st);
  Scratch slot_mem(size_t(slots * slot_floats) * sizeof(float), st);
  const bool gva = P.group > 1;
  const size_t part_bytes = gva ? size_t(shape.tokens * P.HV * P.dk) * sizeof(float) : 0;
  Scratch dq_part(part_bytes, st), dk_part(part_bytes, st);

  BwdArgs A;
  A.dq = gva ? dq_part.as<float>() : dq;
  A.dk = gva ? dk_part.as<float>() : dk;
  A.dv = dv;
  A.dg = dg;
  A.dbeta = dbeta;
  A.d_initial_state = d_initial_state;
  A.dout = dout;
  A.q = q;
  A.k = k;
  A.v = v;
  A.g = g;
  A.beta = beta;
  A.initial_state = initial_state;
  A.cu = offsets.cu_seqlens;
  A.chunk_off = offsets.chunk_starts;
  A.bounds = bounds.as<float>();
  A.slots = slot_mem.as<float>();
  A.slot_floats = slot_floats;
  A.docs = docs;
  A.head_ld = P.HV;
  A.ds_in_smem = ds_in_smem;
  A.P = P;
  const size_t dyn_smem = ds_in_smem ? ds_bytes : 0;
  if (dyn_smem > 48 * 1024)
    VLM_CUDA_CHECK(cudaFuncSetAttribute(bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(dyn_smem)));
  const int threads = (std::max(P.dk, P.dv) + 31) / 32 * 32;
  bwd_kernel<<<unsigned(slots), threads, dyn_smem, st>>>(A);
  check_last_launch("gated_delta_recurrent_bwd");
  if (gva && shape.tokens > 0) {
    const int64_t rows = shape.tokens * P.HK;
    gdn::sum_heads(dq, dq_part.as<float>(), rows, P.group, P.dk, st,
                   "gated_delta_recurrent_bwd (dq head sum)");
    gdn::sum_heads(dk, dk_part.as<float>(), rows, P.group, P.dk, st,
                   "gated_delta_recurrent_bwd (dk head sum)");
  }
}

} // namespace vlm::kernels::cuda
