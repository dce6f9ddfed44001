#include "kernels/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/lane_reduce.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

// The gated delta rule on the CPU (see kernels/gated_delta.h and qwen-models.md §3.4-3.6).
//
// Work items are (document, value head) pairs, run with a dynamic schedule; every item writes only
// its own rows of out / dv / dg / dbeta / states, and its dq / dk rows either directly (HV = HK) or
// into a per-value-head scratch [T, HV, dk] that is summed over the value heads of a k-head in
// head order afterwards. No sum depends on the thread count or on the schedule.
//
// Chunked form, per item and chunk of n <= C tokens (γ = the cumulative log decay inside the chunk,
// E_ij = exp(γ_i - γ_j), A_ij = β_i E_ij k_i·k_j for i > j, T = (I + A)^-1):
//   W = T diag(β e^γ) K and U = T diag(β) V by forward substitution (T is never formed),
//   V' = U - W h (h: the state at the chunk start), O = s [diag(e^γ) Q h + (M ⊙ Q Kᵀ) V'],
//   h <- e^{γ_n} h + Σ_j e^{γ_n - γ_j} k_j V'_jᵀ.
// The backward (§3.6) runs this forward over a document once, keeping h, W, V' and the k·k
// products of every chunk, then walks the chunks backwards. Two identities shorten §3.6 (e): with
// Y = Tᵀ dV' (one backward substitution over dv), X = Tᵀ dW = -Y hᵀ and dA_ij = -Y_i·V'_j, so
// neither dW nor a second substitution over dk is needed.
//
// Every product is a run of "row axpys" c[0, N) += Σ_p a_p · b_p[0, N) over contiguous rows (the
// chunk's q/k/v/dout rows are first copied into small contiguous arrays, k and V' also
// transposed), so the inner loops vectorize over dk, dv or the chunk's tokens; a chunk's arrays
// (about 0.4 MB in float for dk = dv = 64) stay in L2. Cost is linear in tokens: about
// 5.5 n·d² multiply-adds per chunk and head forward and 14 n·d² backward (n = C = d).
namespace vlm::kernels::cpu {

namespace {

constexpr int64_t C = kGatedDeltaChunk;

// Below this much work (tokens · HV · dk · dv) the items run on the calling thread.
constexpr int64_t kParallelMin = 1 << 16;

// Subnormal inputs and results read and written as zero while an object lives (x86: MXCSR's FTZ
// and DAZ bits, restored afterwards; elsewhere a no-op). The chunked form multiplies decays
// e^{γ} down to e^{-87} by further factors below 1 and so produces subnormals whenever the decay
// is strong (g ~ -2.5 per token); each costs a ~100-cycle microcode assist on x86, which made the
// whole kernel 5x slower. Flushing changes only values below 1e-38 (float) / 1e-308 (double).
class FlushSubnormals {
public:
#if defined(__SSE2__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); } // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved_); }

private:
  unsigned saved_;
#else
  FlushSubnormals() {}
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;
};

// a · b + c, fused where the target has FMA (vectorized as such), else two roundings.
template <typename A> inline A madd(A a, A b, A c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// c[0, N) += Σ_{p < P} (alpha · a[p]) · b[p · ldb + (0, N)], p in increasing order. Four rows per
// pass keep c in registers (same order of additions as one row at a time).
template <typename A>
inline void axpy_rows(A* __restrict c, int64_t N, const A* __restrict a, int64_t P,
                      const A* __restrict b, int64_t ldb, A alpha) {
  int64_t p = 0;
  for (; p + 4 <= P; p += 4) {
    const A a0 = alpha * a[p], a1 = alpha * a[p + 1], a2 = alpha * a[p + 2], a3 = alpha * a[p + 3];
    const A* __restrict b0 = b + p * ldb;
    const A* __restrict b1 = b0 + ldb;
    const A* __restrict b2 = b1 + ldb;
    const A* __restrict b3 = b2 + ldb;
    for (int64_t e = 0; e < N; e++)
      c[e] = madd(a3, b3[e], madd(a2, b2[e], madd(a1, b1[e], madd(a0, b0[e], c[e]))));
  }
  for (; p < P; p++) {
    const A ap = alpha * a[p];
    const A* __restrict bp = b + p * ldb;
    for (int64_t e = 0; e < N; e++) c[e] = madd(ap, bp[e], c[e]);
  }
}

// Σ a_i b_i in 16 lanes (a vectorized, fixed order).
template <typename A> inline A dot(const A* a, const A* b, int64_t n) {
  return lane_sum<A>(n, [&](int64_t i) { return a[i] * b[i]; });
}

// dst[c · ldd + r] = src[r · lds + c] for r < rows, c < cols.
template <typename A>
inline void transpose(A* __restrict dst, int64_t ldd, const A* __restrict src, int64_t lds,
                      int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

// The arguments shared by the four entry points, with the head geometry spelled out.
template <typename T> struct Problem {
  const T *q, *k, *v, *g, *beta, *initial_state, *dout;
  const int32_t* cu;
  int64_t HK, HV, dk, dv, group; // group = HV / HK value heads per k-head
  double scale;

  Problem(const T* q_, const T* k_, const T* v_, const T* g_, const T* beta_, const T* init,
          const T* dout_, const int32_t* cu_, const GatedDeltaShape& s)
      : q(q_), k(k_), v(v_), g(g_), beta(beta_), initial_state(init), dout(dout_), cu(cu_),
        HK(s.k_heads), HV(s.v_heads), dk(s.k_dim), dv(s.v_dim),
        group(s.k_heads > 0 ? s.v_heads / s.k_heads : 1), scale(s.scale) {}
  const T* q_row(int64_t t, int64_t j) const { return q + (t * HK + j / group) * dk; }
  const T* k_row(int64_t t, int64_t j) const { return k + (t * HK + j / group) * dk; }
  const T* v_row(int64_t t, int64_t j) const { return v + (t * HV + j) * dv; }
  int64_t doc_len(int64_t b) const { return int64_t(cu[b + 1]) - int64_t(cu[b]); }
};

// Runs item(b, j, thread_workspace) for every (document b, value head j); the longest documents
// first (better balance under the dynamic schedule; the result does not depend on the order).
template <typename T, typename Workspace, typename MakeWorkspace, typename Item>
void for_each_doc_head(const Problem<T>& P, const GatedDeltaShape& s, MakeWorkspace make_ws,
                       Item item) {
  std::vector<int64_t> order(size_t(s.docs));
  for (int64_t b = 0; b < s.docs; b++) order[size_t(b)] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return P.doc_len(a) > P.doc_len(b); });
  const int64_t items = s.docs * s.v_heads;
  const bool parallel = items > 1 && s.tokens * s.v_heads * s.k_dim * s.v_dim > kParallelMin;
#pragma omp parallel if (parallel)
  {
    const FlushSubnormals flush; // per thread: MXCSR is thread state
    Workspace ws = make_ws();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++) item(order[size_t(it / s.v_heads)], it % s.v_heads, ws);
  }
}

// dst[t, hk, :] = Σ_{j in group of hk, in order} part[t, j, :] (the GVA sum of dq or dk).
template <typename T, typename A>
void sum_value_heads(T* dst, const std::vector<A>& part, const Problem<T>& P, int64_t tokens) {
  const bool parallel = tokens * P.HV * P.dk > kParallelMin;
#pragma omp parallel for if (parallel)
  for (int64_t t = 0; t < tokens; t++)
    for (int64_t hk = 0; hk < P.HK; hk++) {
      T* out = dst + (t * P.HK + hk) * P.dk;
      const A* src = part.data() + (t * P.HV + hk * P.group) * P.dk;
      for (int64_t d = 0; d < P.dk; d++) {
        A sum = src[d];
        for (int64_t i = 1; i < P.group; i++) sum += src[i * P.dk + d];
        out[d] = T(sum);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// The recurrence.

template <typename A> struct RecurrentWorkspace {
  std::vector<A> S, states, kS, delta, dS, dq, dk;
  RecurrentWorkspace(int64_t dk_, int64_t dv_, int64_t max_len, bool backward)
      : S(size_t(dk_ * dv_)), states(backward ? size_t((max_len + 1) * dk_ * dv_) : 0),
        kS(size_t(dv_)), delta(size_t(dv_)), dS(backward ? size_t(dk_ * dv_) : 0), dq(size_t(dk_)),
        dk(size_t(dk_)) {}
};

int64_t max_doc_len(const int32_t* cu, int64_t docs) {
  int64_t m = 0;
  for (int64_t b = 0; b < docs; b++) m = std::max(m, int64_t(cu[b + 1]) - int64_t(cu[b]));
  return m;
}

// One token of the recurrence on S [dk, dv] in place: S <- α S; kS = Sᵀ k; δ = β (v - kS);
// S += k δᵀ. Leaves kS and δ in the workspace.
template <typename T, typename A>
void recurrent_step(A* S, A* kS, A* delta, const T* kt, const T* vt, A alpha, A b, int64_t dk,
                    int64_t dv) {
  for (int64_t i = 0; i < dk * dv; i++) S[i] *= alpha;
  std::fill(kS, kS + dv, A(0));
  for (int64_t d = 0; d < dk; d++) {
    const A kd = A(kt[d]);
    for (int64_t e = 0; e < dv; e++) kS[e] += kd * S[d * dv + e];
  }
  for (int64_t e = 0; e < dv; e++) delta[e] = b * (A(vt[e]) - kS[e]);
  for (int64_t d = 0; d < dk; d++) {
    const A kd = A(kt[d]);
    for (int64_t e = 0; e < dv; e++) S[d * dv + e] += kd * delta[e];
  }
}

// The backward of token t of value head j: ws.dS = the gradient of the state after the token on
// entry, before it on return; Sp = the state before the token, Sp + dk·dv the state after it.
// Writes the token's dv, dg, dbeta and this head's dq / dk rows.
template <typename T, typename A>
void recurrent_step_backward(RecurrentWorkspace<A>& ws, const Problem<T>& P, int64_t t, int64_t j,
                             const A* Sp, T* dq_row, T* dk_row, T* dv, T* dg, T* dbeta) {
  const int64_t Dk = P.dk, Dv = P.dv, size = Dk * Dv;
  const T *qt = P.q_row(t, j), *kt = P.k_row(t, j), *vt = P.v_row(t, j);
  const T* dot_ = P.dout + (t * P.HV + j) * Dv;
  const A s = A(P.scale), alpha = std::exp(A(P.g[t * P.HV + j])), bt = A(P.beta[t * P.HV + j]);
  A *dS = ws.dS.data(), *St = ws.S.data(), *kS = ws.kS.data(), *ddelta = ws.delta.data();
  // S̃ = α S_prev, kS = S̃ᵀ k, δ = β (v - kS), S = S̃ + k δᵀ.
  for (int64_t x = 0; x < size; x++) St[x] = alpha * Sp[x];
  std::fill(kS, kS + Dv, A(0));
  for (int64_t d = 0; d < Dk; d++)
    for (int64_t e = 0; e < Dv; e++) kS[e] += A(kt[d]) * St[d * Dv + e];
  // o = s Sᵀ q: dq = s S dO, dS += s q dOᵀ.
  const A* S = Sp + size;
  for (int64_t d = 0; d < Dk; d++) {
    A sum = 0;
    for (int64_t e = 0; e < Dv; e++) sum += S[d * Dv + e] * A(dot_[e]);
    dq_row[d] = T(s * sum);
    const A qd = s * A(qt[d]);
    for (int64_t e = 0; e < Dv; e++) dS[d * Dv + e] += qd * A(dot_[e]);
  }
  // S = S̃ + k δᵀ: dδ = dSᵀ k, dk = dS δ, dv = β dδ, dβ = dδ·(v - kS).
  A dbt = 0;
  for (int64_t e = 0; e < Dv; e++) {
    A sum = 0;
    for (int64_t d = 0; d < Dk; d++) sum += dS[d * Dv + e] * A(kt[d]);
    ddelta[e] = sum;
    dbt += sum * (A(vt[e]) - kS[e]);
    dv[(t * P.HV + j) * Dv + e] = T(bt * sum);
  }
  // kS = S̃ᵀ k receives w = -β dδ: dS̃ = dS + k wᵀ, dk += S̃ w.
  for (int64_t d = 0; d < Dk; d++) {
    A sum_delta = 0, sum_w = 0;
    for (int64_t e = 0; e < Dv; e++) {
      const A w = -bt * ddelta[e];
      sum_delta += dS[d * Dv + e] * bt * (A(vt[e]) - kS[e]);
      sum_w += St[d * Dv + e] * w;
      dS[d * Dv + e] += A(kt[d]) * w;
    }
    dk_row[d] = T(sum_delta + sum_w);
  }
  // S̃ = α S_prev: dg = ⟨dS̃, S̃⟩, dS_prev = α dS̃.
  A dgt = 0;
  for (int64_t x = 0; x < size; x++) dgt += dS[x] * St[x];
  for (int64_t x = 0; x < size; x++) dS[x] *= alpha;
  dg[t * P.HV + j] = T(dgt);
  dbeta[t * P.HV + j] = T(dbt);
}

// ---------------------------------------------------------------------------------------------
// The chunked form.

template <typename A> struct ChunkWorkspace {
  int64_t dk, dv;
  // One chunk's inputs: q, k [C, dk], kᵀ [dk, C], v [C, dv], dout [C, dv]; per token β, e^γ,
  // e^{γ_n - γ}, and γ itself in double (the differences γ_i - γ_j lose less that way).
  std::vector<A> q, k, kt, v, dout, beta, eg, egn;
  std::vector<double> gamma;
  // [C, C]: E (lower with diagonal), k·k (strictly lower), L = s E ⊙ (q·k) (lower with diagonal).
  std::vector<A> E, kk, L;
  std::vector<A> W, U, S, out, coef; // W [C, dk], U / V' [C, dv], S [dk, dv], out [C, dv], coef [C]
  // Backward: per document the state at every chunk start, W, V' and k·k of every chunk.
  std::vector<A> h_all, W_all, Vp_all, kk_all;
  std::vector<A> vpt, dL, dVp, Y, X, ht, dSt, dS, dq, dkk, tmp, dA, dgam, dbeta;

  ChunkWorkspace(int64_t dk_, int64_t dv_, int64_t max_len, bool backward) : dk(dk_), dv(dv_) {
    auto sz = [](int64_t n) { return size_t(n); };
    q.resize(sz(C * dk));
    k.resize(sz(C * dk));
    kt.resize(sz(dk * C));
    v.resize(sz(C * dv));
    dout.resize(sz(C * dv));
    beta.resize(sz(C));
    eg.resize(sz(C));
    egn.resize(sz(C));
    gamma.resize(sz(C));
    E.resize(sz(C * C));
    kk.resize(sz(C * C));
    L.resize(sz(C * C));
    W.resize(sz(C * dk));
    U.resize(sz(C * dv));
    S.resize(sz(dk * dv));
    out.resize(sz(C * dv));
    coef.resize(sz(C));
    if (!backward) return;
    const int64_t chunks = (max_len + C - 1) / C;
    h_all.resize(sz(chunks * dk * dv));
    W_all.resize(sz(chunks * C * dk));
    Vp_all.resize(sz(chunks * C * dv));
    kk_all.resize(sz(chunks * C * C));
    vpt.resize(sz(dv * C));
    dL.resize(sz(C * C));
    dVp.resize(sz(C * dv));
    Y.resize(sz(C * dv));
    X.resize(sz(C * dk));
    ht.resize(sz(dv * dk));
    dSt.resize(sz(dv * dk));
    dS.resize(sz(dk * dv));
    dq.resize(sz(C * dk));
    dkk.resize(sz(C * dk));
    tmp.resize(sz(std::max(dk, dv)));
    dA.resize(sz(C * C));
    dgam.resize(sz(C));
    dbeta.resize(sz(C));
  }
};

// Loads chunk [t0, t0 + n) of value head j: q, k, kᵀ, v (and dout when given), β, γ, e^γ,
// e^{γ_n - γ}, E. With `with_kk`, also the strictly lower k·k products (ws.kk).
template <typename T, typename A>
void load_chunk(ChunkWorkspace<A>& ws, const Problem<T>& P, int64_t t0, int64_t n, int64_t j,
                bool with_kk) {
  const int64_t dk = P.dk, dv = P.dv;
  for (int64_t i = 0; i < n; i++) {
    const T* qr = P.q_row(t0 + i, j);
    const T* kr = P.k_row(t0 + i, j);
    const T* vr = P.v_row(t0 + i, j);
    for (int64_t d = 0; d < dk; d++) ws.q[i * dk + d] = A(qr[d]);
    for (int64_t d = 0; d < dk; d++) ws.k[i * dk + d] = A(kr[d]);
    for (int64_t e = 0; e < dv; e++) ws.v[i * dv + e] = A(vr[e]);
    if (P.dout) {
      const T* dr = P.dout + ((t0 + i) * P.HV + j) * dv;
      for (int64_t e = 0; e < dv; e++) ws.dout[i * dv + e] = A(dr[e]);
    }
    ws.beta[i] = A(P.beta[(t0 + i) * P.HV + j]);
    ws.gamma[i] = (i ? ws.gamma[i - 1] : 0.0) + double(P.g[(t0 + i) * P.HV + j]);
  }
  transpose(ws.kt.data(), C, ws.k.data(), dk, n, dk);
  const double last = ws.gamma[n - 1];
  for (int64_t i = 0; i < n; i++) {
    ws.eg[i] = exp_nonpositive(A(ws.gamma[i]));
    ws.egn[i] = exp_nonpositive(A(last - ws.gamma[i]));
    A* Ei = ws.E.data() + i * C;
    const double gi = ws.gamma[i];
    for (int64_t c = 0; c <= i; c++) Ei[c] = exp_nonpositive(A(gi - ws.gamma[c]));
  }
  if (with_kk)
    for (int64_t i = 0; i < n; i++) {
      A* kki = ws.kk.data() + i * C;
      std::fill(kki, kki + i, A(0));
      axpy_rows(kki, i, ws.k.data() + i * dk, dk, ws.kt.data(), C, A(1));
    }
}

// The forward of one loaded chunk on the state ws.S (the state at the chunk start, h): W, U,
// V' = U - W h (in ws.U); with `outputs`, ws.out = O (needs ws.q); then S <- the state at the
// chunk end. kk: the chunk's k·k products.
template <typename A>
void chunk_forward(ChunkWorkspace<A>& ws, const A* kk, int64_t n, A scale, bool outputs) {
  const int64_t dk = ws.dk, dv = ws.dv;
  A* W = ws.W.data();
  A* U = ws.U.data();
  A* S = ws.S.data();
  A* coef = ws.coef.data();
  // W_i = β_i e^{γ_i} k_i - Σ_{j<i} A_ij W_j; U_i = β_i v_i - Σ_{j<i} A_ij U_j.
  for (int64_t i = 0; i < n; i++) {
    const A bi = ws.beta[i];
    const A* Ei = ws.E.data() + i * C;
    const A* kki = kk + i * C;
    for (int64_t c = 0; c < i; c++) coef[c] = bi * Ei[c] * kki[c];
    const A bw = bi * ws.eg[i];
    for (int64_t d = 0; d < dk; d++) W[i * dk + d] = bw * ws.k[i * dk + d];
    for (int64_t e = 0; e < dv; e++) U[i * dv + e] = bi * ws.v[i * dv + e];
    axpy_rows(W + i * dk, dk, coef, i, W, dk, A(-1));
    axpy_rows(U + i * dv, dv, coef, i, U, dv, A(-1));
  }
  // V' = U - W h (in place in U).
  for (int64_t i = 0; i < n; i++) axpy_rows(U + i * dv, dv, W + i * dk, dk, S, dv, A(-1));
  if (outputs) {
    // L = s E ⊙ (q kᵀ) (lower with the diagonal); O_i = s e^{γ_i} q_i h + Σ_{c≤i} L_ic V'_c.
    for (int64_t i = 0; i < n; i++) {
      A* Li = ws.L.data() + i * C;
      std::fill(Li, Li + i + 1, A(0));
      axpy_rows(Li, i + 1, ws.q.data() + i * dk, dk, ws.kt.data(), C, A(1));
      const A* Ei = ws.E.data() + i * C;
      for (int64_t c = 0; c <= i; c++) Li[c] *= scale * Ei[c];
      A* Oi = ws.out.data() + i * dv;
      std::fill(Oi, Oi + dv, A(0));
      axpy_rows(Oi, dv, ws.q.data() + i * dk, dk, S, dv, scale * ws.eg[i]);
      axpy_rows(Oi, dv, Li, i + 1, U, dv, A(1));
    }
  }
  // S <- e^{γ_n} h + Σ_c e^{γ_n - γ_c} k_c V'_cᵀ.
  const A decay = ws.eg[n - 1];
  for (int64_t d = 0; d < dk; d++) {
    A* Sd = S + d * dv;
    for (int64_t e = 0; e < dv; e++) Sd[e] *= decay;
    const A* ktd = ws.kt.data() + d * C;
    for (int64_t c = 0; c < n; c++) coef[c] = ws.egn[c] * ktd[c];
    axpy_rows(Sd, dv, coef, n, U, dv, A(1));
  }
}

template <typename T, typename A>
void load_initial_state(A* S, const Problem<T>& P, int64_t b, int64_t j) {
  const int64_t size = P.dk * P.dv;
  if (P.initial_state) {
    const T* src = P.initial_state + (b * P.HV + j) * size;
    for (int64_t i = 0; i < size; i++) S[i] = A(src[i]);
  } else {
    std::fill(S, S + size, A(0));
  }
}

// What the backward's forward pass keeps of one chunk: h = the state at the chunk start, W, V'
// and the k·k products (strictly lower, [C, C]).
template <typename A> struct ChunkSaved { const A *h, *W, *Vp, *kk; };

// Backward stage 1 (the value side; ws holds the loaded chunk, ws.dS the gradient of the state
// at the chunk end): ws.kk <- q·k (lower with the diagonal), ws.L = s E ⊙ (q·k),
// ws.dL_ic = dO_i·V'_c, ws.dVp = dV' = Lᵀ dO + diag(e^{γ_n - γ}) K dS, ws.Y = Tᵀ dV',
// ws.dbeta = v·Y (its first term).
template <typename A> void backward_values(ChunkWorkspace<A>& ws, int64_t n, A s, ChunkSaved<A> f) {
  const int64_t dk = ws.dk, dv = ws.dv;
  const A *Q = ws.q.data(), *K = ws.k.data(), *dO = ws.dout.data(), *E = ws.E.data();
  A *QK = ws.kk.data(), *L = ws.L.data(), *dL = ws.dL.data(), *vpt = ws.vpt.data();
  A *dVp = ws.dVp.data(), *Y = ws.Y.data(), *coef = ws.coef.data();
  transpose(vpt, C, f.Vp, dv, n, dv);
  for (int64_t i = 0; i < n; i++) {
    A* QKi = QK + i * C;
    A* dLi = dL + i * C;
    std::fill(QKi, QKi + i + 1, A(0));
    std::fill(dLi, dLi + i + 1, A(0));
    axpy_rows(QKi, i + 1, Q + i * dk, dk, ws.kt.data(), C, A(1));
    axpy_rows(dLi, i + 1, dO + i * dv, dv, vpt, C, A(1));
    for (int64_t c = 0; c <= i; c++) L[i * C + c] = s * E[i * C + c] * QKi[c];
  }
  for (int64_t c = 0; c < n; c++) {
    for (int64_t i = c; i < n; i++) coef[i] = L[i * C + c];
    A* dVc = dVp + c * dv;
    std::fill(dVc, dVc + dv, A(0));
    axpy_rows(dVc, dv, coef + c, n - c, dO + c * dv, dv, A(1));
    axpy_rows(dVc, dv, K + c * dk, dk, ws.dS.data(), dv, ws.egn[c]);
  }
  // Y_i = dV'_i - Σ_{c>i} A_ci Y_c (backward substitution with (I + A)ᵀ).
  for (int64_t i = n - 1; i >= 0; i--) {
    for (int64_t c = i + 1; c < n; c++) coef[c] = ws.beta[c] * E[c * C + i] * f.kk[c * C + i];
    A* Yi = Y + i * dv;
    std::copy(dVp + i * dv, dVp + (i + 1) * dv, Yi);
    axpy_rows(Yi, dv, coef + i + 1, n - i - 1, Y + (i + 1) * dv, dv, A(-1));
    ws.dbeta[i] = dot(ws.v.data() + i * dv, Yi, dv);
  }
}

// Backward stage 2: ws.dq (all of it), ws.dkk (all but the A terms), ws.X = Tᵀ dW = -Y hᵀ, and
// ws.dgam / ws.dbeta from the outputs, the state carried out and W's diag(β e^γ):
//   dq_i = s e^{γ_i} h dO_i + Σ_{c<=i} B_ic k_c with B = s E ⊙ dL (in ws.L from here on),
//   dk_c = Σ_{i>=c} B_ic q_i + e^{γ_n - γ_c} dS V'_c + β_c e^{γ_c} X_c.
template <typename A> void backward_keys(ChunkWorkspace<A>& ws, int64_t n, A s, ChunkSaved<A> f) {
  const int64_t dk = ws.dk, dv = ws.dv, last = n - 1;
  const A *Q = ws.q.data(), *K = ws.k.data(), *dO = ws.dout.data(), *E = ws.E.data();
  const A *QK = ws.kk.data(), *dL = ws.dL.data(), *Y = ws.Y.data(), *eg = ws.eg.data();
  A *B = ws.L.data(), *X = ws.X.data(), *dq = ws.dq.data(), *dkk = ws.dkk.data();
  A *dgam = ws.dgam.data(), *ht = ws.ht.data(), *dSt = ws.dSt.data(), *coef = ws.coef.data();
  A* tmp = ws.tmp.data();
  transpose(ht, dk, f.h, dv, dk, dv);
  for (int64_t i = 0; i < n; i++) {
    A* Xi = X + i * dk;
    A* dqi = dq + i * dk;
    std::fill(Xi, Xi + dk, A(0));
    std::fill(dqi, dqi + dk, A(0));
    axpy_rows(Xi, dk, Y + i * dv, dv, ht, dk, A(-1));
    axpy_rows(dqi, dk, dO + i * dv, dv, ht, dk, s * eg[i]);
    dgam[i] = dot(Q + i * dk, dqi, dk); // dγ_i from e^{γ_i} in the inter-chunk output
    // P_ic = B_ic (q_i·k_c): dγ_i += Σ_c P_ic, dγ_c -= Σ_i P_ic.
    A* Bi = B + i * C;
    A row = 0;
    for (int64_t c = 0; c <= i; c++) {
      Bi[c] = s * E[i * C + c] * dL[i * C + c];
      const A p = Bi[c] * QK[i * C + c];
      row += p;
      dgam[c] -= p;
    }
    dgam[i] += row;
    axpy_rows(dqi, dk, Bi, i + 1, K, dk, A(1));
  }
  transpose(dSt, dk, ws.dS.data(), dv, dk, dv);
  for (int64_t c = 0; c < n; c++) {
    A* dkc = dkk + c * dk;
    const A* kc = K + c * dk;
    for (int64_t i = c; i < n; i++) coef[i] = B[i * C + c];
    std::fill(dkc, dkc + dk, A(0));
    axpy_rows(dkc, dk, coef + c, n - c, Q + c * dk, dk, A(1));
    std::fill(tmp, tmp + dk, A(0));
    axpy_rows(tmp, dk, f.Vp + c * dv, dv, dSt, dk, ws.egn[c]);
    const A ts = dot(kc, tmp, dk); // the state's e^{γ_n - γ_c}
    dgam[last] += ts;
    dgam[c] -= ts;
    const A bw = ws.beta[c] * eg[c];
    const A* Xc = X + c * dk;
    const A tx = dot(kc, Xc, dk); // W's β_c e^{γ_c}
    ws.dbeta[c] += eg[c] * tx;
    dgam[c] += bw * tx;
    for (int64_t d = 0; d < dk; d++) dkc[d] += tmp[d] + bw * Xc[d];
  }
  dgam[last] += eg[last] * dot(ws.dS.data(), f.h, dk * dv); // the state's e^{γ_n} h
}

// Backward stage 3, through A_ic = β_i E_ic k_i·k_c (c < i): dA_ic = -Y_i·V'_c, G = dA ⊙ E;
// dγ_i += dA_ic A_ic, dγ_c -= dA_ic A_ic; dβ_i += Σ_c G_ic k_i·k_c;
// dk_i += β_i Σ_c G_ic k_c; dk_c += Σ_i β_i G_ic k_i.
template <typename A> void backward_wy(ChunkWorkspace<A>& ws, int64_t n, ChunkSaved<A> f) {
  const int64_t dk = ws.dk, dv = ws.dv;
  const A *K = ws.k.data(), *E = ws.E.data(), *beta = ws.beta.data();
  A *G = ws.dA.data(), *dkk = ws.dkk.data(), *dgam = ws.dgam.data(), *coef = ws.coef.data();
  for (int64_t i = 1; i < n; i++) {
    A* Gi = G + i * C;
    std::fill(Gi, Gi + i, A(0));
    axpy_rows(Gi, i, ws.Y.data() + i * dv, dv, ws.vpt.data(), C, A(-1)); // dA_i
    const A* kki = f.kk + i * C;
    A row_gamma = 0, row_beta = 0;
    for (int64_t c = 0; c < i; c++) {
      Gi[c] *= E[i * C + c];
      const A dAA = Gi[c] * beta[i] * kki[c]; // dA_ic A_ic
      row_gamma += dAA;
      dgam[c] -= dAA;
      row_beta += Gi[c] * kki[c];
    }
    dgam[i] += row_gamma;
    ws.dbeta[i] += row_beta;
    axpy_rows(dkk + i * dk, dk, Gi, i, K, dk, beta[i]);
  }
  for (int64_t c = 0; c + 1 < n; c++) {
    for (int64_t i = c + 1; i < n; i++) coef[i] = beta[i] * G[i * C + c];
    axpy_rows(dkk + c * dk, dk, coef + c + 1, n - c - 1, K + (c + 1) * dk, dk, A(1));
  }
}

// The backward of one chunk [t0, t0 + n) of value head j given its saved forward values;
// ws.dS = the gradient of the state at the chunk end on entry, at the chunk start on return.
// Writes the chunk's dv, dg, dbeta rows and this value head's dq / dk rows (in dq_out / dk_out,
// rows `ld_head` heads apart, at head jq).
template <typename T, typename A>
void chunk_backward(ChunkWorkspace<A>& ws, const Problem<T>& P, int64_t t0, int64_t n, int64_t j,
                    ChunkSaved<A> f, T* dq_out, T* dk_out, int64_t ld_head, int64_t jq, T* dv_out,
                    T* dg_out, T* dbeta_out) {
  const int64_t dk = P.dk, dv = P.dv;
  const A s = A(P.scale);
  load_chunk(ws, P, t0, n, j, false);
  backward_values(ws, n, s, f);
  backward_keys(ws, n, s, f);
  backward_wy(ws, n, f);
  // dS <- e^{γ_n} dS + s Σ_i e^{γ_i} q_i dO_iᵀ - Σ_i W_i dV'_iᵀ.
  A* coef = ws.coef.data();
  for (int64_t d = 0; d < dk; d++) {
    A* dSd = ws.dS.data() + d * dv;
    for (int64_t e = 0; e < dv; e++) dSd[e] *= ws.eg[n - 1];
    for (int64_t i = 0; i < n; i++) coef[i] = s * ws.eg[i] * ws.q[i * dk + d];
    axpy_rows(dSd, dv, coef, n, ws.dout.data(), dv, A(1));
    for (int64_t i = 0; i < n; i++) coef[i] = f.W[i * dk + d];
    axpy_rows(dSd, dv, coef, n, ws.dVp.data(), dv, A(-1));
  }
  // dg_t = Σ_{i>=t} dγ_i (γ is the cumulative sum of g); dv = β Y.
  A acc = 0;
  for (int64_t i = n - 1; i >= 0; i--) {
    acc += ws.dgam[i];
    dg_out[(t0 + i) * P.HV + j] = T(acc);
    dbeta_out[(t0 + i) * P.HV + j] = T(ws.dbeta[i]);
  }
  for (int64_t i = 0; i < n; i++) {
    T* dvr = dv_out + ((t0 + i) * P.HV + j) * dv;
    T* dqr = dq_out + ((t0 + i) * ld_head + jq) * dk;
    T* dkr = dk_out + ((t0 + i) * ld_head + jq) * dk;
    for (int64_t e = 0; e < dv; e++) dvr[e] = T(ws.beta[i] * ws.Y[i * dv + e]);
    for (int64_t d = 0; d < dk; d++) dqr[d] = T(ws.dq[i * dk + d]);
    for (int64_t d = 0; d < dk; d++) dkr[d] = T(ws.dkk[i * dk + d]);
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------

template <typename T>
void gated_delta_recurrent_fwd(T* out, T* final_state, const T* q, const T* k, const T* v,
                               const T* g, const T* beta, const T* initial_state,
                               const int32_t* cu_seqlens, const GatedDeltaShape& shape) {
  using A = T;
  const Problem<T> P(q, k, v, g, beta, initial_state, nullptr, cu_seqlens, shape);
  const int64_t dk = P.dk, dv = P.dv;
  const A s = A(P.scale);
  for_each_doc_head<T, RecurrentWorkspace<A>>(
      P, shape, [&] { return RecurrentWorkspace<A>(dk, dv, 0, false); },
      [&](int64_t b, int64_t j, RecurrentWorkspace<A>& ws) {
        A* S = ws.S.data();
        load_initial_state(S, P, b, j);
        for (int64_t t = cu_seqlens[b]; t < cu_seqlens[b + 1]; t++) {
          const A alpha = std::exp(A(g[t * P.HV + j]));
          recurrent_step(S, ws.kS.data(), ws.delta.data(), P.k_row(t, j), P.v_row(t, j), alpha,
                         A(beta[t * P.HV + j]), dk, dv);
          const T* qt = P.q_row(t, j);
          A* o = ws.kS.data(); // reused: o = Sᵀ (s q)
          std::fill(o, o + dv, A(0));
          for (int64_t d = 0; d < dk; d++) {
            const A qd = s * A(qt[d]);
            for (int64_t e = 0; e < dv; e++) o[e] += qd * S[d * dv + e];
          }
          for (int64_t e = 0; e < dv; e++) out[(t * P.HV + j) * dv + e] = T(o[e]);
        }
        if (final_state) std::copy(S, S + dk * dv, final_state + (b * P.HV + j) * dk * dv);
      });
}

template <typename T>
void gated_delta_recurrent_bwd(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* d_initial_state,
                               const T* dout, const T* q, const T* k, const T* v, const T* g,
                               const T* beta, const T* initial_state, const int32_t* cu_seqlens,
                               const GatedDeltaShape& shape) {
  using A = T;
  const Problem<T> P(q, k, v, g, beta, initial_state, dout, cu_seqlens, shape);
  const int64_t Dk = P.dk, Dv = P.dv, size = Dk * Dv;
  const bool gva = P.group > 1;
  std::vector<A> dq_part(gva ? size_t(shape.tokens * P.HV * Dk) : 0);
  std::vector<A> dk_part(dq_part.size());
  const int64_t max_len = max_doc_len(cu_seqlens, shape.docs);
  for_each_doc_head<T, RecurrentWorkspace<A>>(
      P, shape, [&] { return RecurrentWorkspace<A>(Dk, Dv, max_len, true); },
      [&](int64_t b, int64_t j, RecurrentWorkspace<A>& ws) {
        const int64_t t0 = cu_seqlens[b], len = P.doc_len(b);
        // states[i] = the state before token t0 + i (states[len]: the final state).
        A* states = ws.states.data();
        load_initial_state(states, P, b, j);
        for (int64_t i = 0; i < len; i++) {
          const int64_t t = t0 + i;
          std::copy(states + i * size, states + (i + 1) * size, states + (i + 1) * size);
          recurrent_step(states + (i + 1) * size, ws.kS.data(), ws.delta.data(), P.k_row(t, j),
                         P.v_row(t, j), std::exp(A(g[t * P.HV + j])), A(beta[t * P.HV + j]), Dk,
                         Dv);
        }
        A* dS = ws.dS.data();
        std::fill(dS, dS + size, A(0));
        for (int64_t t = t0 + len - 1; t >= t0; t--) {
          T* dq_row = gva ? dq_part.data() + (t * P.HV + j) * Dk : dq + (t * P.HK + j) * Dk;
          T* dk_row = gva ? dk_part.data() + (t * P.HV + j) * Dk : dk + (t * P.HK + j) * Dk;
          recurrent_step_backward(ws, P, t, j, states + (t - t0) * size, dq_row, dk_row, dv, dg,
                                  dbeta);
        }
        if (d_initial_state) std::copy(dS, dS + size, d_initial_state + (b * P.HV + j) * size);
      });
  if (gva) {
    sum_value_heads(dq, dq_part, P, shape.tokens);
    sum_value_heads(dk, dk_part, P, shape.tokens);
  }
}

template <typename T>
void gated_delta_chunk_fwd(T* out, T* final_state, const T* q, const T* k, const T* v, const T* g,
                           const T* beta, const T* initial_state, const int32_t* cu_seqlens,
                           const GatedDeltaShape& shape) {
  using A = T;
  const Problem<T> P(q, k, v, g, beta, initial_state, nullptr, cu_seqlens, shape);
  const int64_t dk = P.dk, dv = P.dv;
  const A s = A(P.scale);
  for_each_doc_head<T, ChunkWorkspace<A>>(
      P, shape, [&] { return ChunkWorkspace<A>(dk, dv, 0, false); },
      [&](int64_t b, int64_t j, ChunkWorkspace<A>& ws) {
        A* S = ws.S.data();
        load_initial_state(S, P, b, j);
        for (int64_t t0 = cu_seqlens[b]; t0 < cu_seqlens[b + 1]; t0 += C) {
          const int64_t n = std::min<int64_t>(C, cu_seqlens[b + 1] - t0);
          load_chunk(ws, P, t0, n, j, true);
          chunk_forward(ws, ws.kk.data(), n, s, true);
          for (int64_t i = 0; i < n; i++) {
            T* o = out + ((t0 + i) * P.HV + j) * dv;
            for (int64_t e = 0; e < dv; e++) o[e] = T(ws.out[i * dv + e]);
          }
        }
        if (final_state) std::copy(S, S + dk * dv, final_state + (b * P.HV + j) * dk * dv);
      });
}

template <typename T>
void gated_delta_chunk_bwd(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* d_initial_state, const T* dout,
                           const T* q, const T* k, const T* v, const T* g, const T* beta,
                           const T* initial_state, const int32_t* cu_seqlens,
                           const GatedDeltaShape& shape) {
  using A = T;
  const Problem<T> P(q, k, v, g, beta, initial_state, dout, cu_seqlens, shape);
  const int64_t Dk = P.dk, Dv = P.dv;
  const A s = A(P.scale);
  const bool gva = P.group > 1;
  // With GVA each value head writes its dq / dk rows here ([T, HV, dk]), summed per k-head below.
  std::vector<A> dq_part(gva ? size_t(shape.tokens * P.HV * Dk) : 0);
  std::vector<A> dk_part(dq_part.size());
  T* dq_dst = gva ? dq_part.data() : dq;
  T* dk_dst = gva ? dk_part.data() : dk;
  const int64_t ld_head = gva ? P.HV : P.HK;
  const int64_t max_len = max_doc_len(cu_seqlens, shape.docs);
  const Problem<T> Pf(q, k, v, g, beta, initial_state, nullptr, cu_seqlens, shape); // no dout
  for_each_doc_head<T, ChunkWorkspace<A>>(
      P, shape, [&] { return ChunkWorkspace<A>(Dk, Dv, max_len, true); },
      [&](int64_t b, int64_t j, ChunkWorkspace<A>& ws) {
        const int64_t start = cu_seqlens[b], end = cu_seqlens[b + 1];
        const int64_t chunks = (end - start + C - 1) / C;
        // Forward over the document, keeping h, W, V' and k·k of every chunk.
        A* S = ws.S.data();
        load_initial_state(S, P, b, j);
        for (int64_t c = 0; c < chunks; c++) {
          const int64_t t0 = start + c * C, n = std::min<int64_t>(C, end - t0);
          std::copy(S, S + Dk * Dv, ws.h_all.data() + c * Dk * Dv);
          load_chunk(ws, Pf, t0, n, j, true);
          chunk_forward(ws, ws.kk.data(), n, s, false);
          std::copy(ws.W.data(), ws.W.data() + n * Dk, ws.W_all.data() + c * C * Dk);
          std::copy(ws.U.data(), ws.U.data() + n * Dv, ws.Vp_all.data() + c * C * Dv);
          std::copy(ws.kk.data(), ws.kk.data() + n * C, ws.kk_all.data() + c * C * C);
        }
        // Backward over the chunks in reverse; dS: the gradient of the state at the chunk end.
        std::fill(ws.dS.begin(), ws.dS.end(), A(0));
        for (int64_t c = chunks - 1; c >= 0; c--) {
          const int64_t t0 = start + c * C, n = std::min<int64_t>(C, end - t0);
          const ChunkSaved<A> saved{ws.h_all.data() + c * Dk * Dv, ws.W_all.data() + c * C * Dk,
                                    ws.Vp_all.data() + c * C * Dv, ws.kk_all.data() + c * C * C};
          chunk_backward(ws, P, t0, n, j, saved, dq_dst, dk_dst, ld_head, gva ? j : j / P.group, dv,
                         dg, dbeta);
        }
        if (d_initial_state)
          std::copy(ws.dS.begin(), ws.dS.end(), d_initial_state + (b * P.HV + j) * Dk * Dv);
      });
  if (gva) {
    sum_value_heads(dq, dq_part, P, shape.tokens);
    sum_value_heads(dk, dk_part, P, shape.tokens);
  }
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void gated_delta_recurrent_fwd<T>(T*, T*, const T*, const T*, const T*, const T*,       \
                                             const T*, const T*, const int32_t*,                   \
                                             const GatedDeltaShape&);                              \
  template void gated_delta_recurrent_bwd<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, \
                                             const T*, const T*, const T*, const T*,               \
                                             const int32_t*, const GatedDeltaShape&);              \
  template void gated_delta_chunk_fwd<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                         const T*, const int32_t*, const GatedDeltaShape&);        \
  template void gated_delta_chunk_bwd<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*,     \
                                         const T*, const T*, const T*, const T*, const int32_t*,   \
                                         const GatedDeltaShape&);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
