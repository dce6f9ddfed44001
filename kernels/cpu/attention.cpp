#include "kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

// Flash attention on the CPU: tiles of query rows x key rows whose inner products are small dense
// matrix products (OpenBLAS sgemm / dgemm: its runtime-dispatched AVX2 / AVX-512 / NEON kernels
// run at GEMM speed whatever this file is compiled for), with the softmax kept online per query
// row (running max and sum) so no [T, T] matrix is ever held. Work items are blocks of 128 rows of
// one document and one head, independent of each other and of the thread count, so results are
// deterministic: every sum runs in a fixed order (BLAS called on a fixed tile, in one thread
// inside the parallel region).
namespace vlm::kernels::cpu {

namespace {

constexpr int64_t kBlockRows = 128; // rows per work item (queries; keys in the dK/dV pass)
constexpr int64_t kTile = 512;      // keys per tile (forward, dQ), queries per tile (dK/dV)

// Below this many multiply-adds (sum over documents of len^2 · heads · D) a parallel region
// costs more than it saves.
constexpr int64_t kParallelWork = int64_t(1) << 18;

int64_t attention_work(const int32_t* cu_seqlens, int64_t docs, int64_t heads, int64_t D) {
  int64_t work = 0;
  for (int64_t b = 0; b < docs; b++) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    work += len * len * heads * D;
  }
  return work;
}

struct Block {
  int64_t doc, head, begin, end; // rows [begin, end) relative to the document start
  int64_t work;                  // rows x keys it visits (for the schedule)
};

// Blocks of every document and head, the largest first (causal blocks near a document's end see
// the most keys), which balances the dynamic schedule.
std::vector<Block> make_blocks(const int32_t* cu_seqlens, int64_t docs, int64_t heads, bool causal,
                               bool keys_first) {
  std::vector<Block> blocks;
  for (int64_t b = 0; b < docs; b++) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t h = 0; h < heads; h++)
      for (int64_t r = 0; r < len; r += kBlockRows) {
        const int64_t end = std::min(len, r + kBlockRows);
        const int64_t seen = !causal ? len : keys_first ? len - r : end;
        blocks.push_back({b, h, r, end, (end - r) * seen});
      }
  }
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.work > b.work; });
  return blocks;
}

// C[M, N] = alpha · op(A) · op(B) + beta · C, row-major (one thread inside parallel regions).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// `rows` rows of D values, `stride` apart, as A: the memory itself when T is A (ld = stride),
// else converted into `scratch` (ld = D).
template <typename A, typename T>
const A* rows_as(const T* src, int64_t rows, int64_t stride, int64_t D, std::vector<A>& scratch,
                 int64_t& ld) {
  if constexpr (std::is_same_v<A, T>) {
    ld = stride;
    return src;
  } else {
    scratch.resize(size_t(rows * D));
    for (int64_t r = 0; r < rows; r++)
      for (int64_t d = 0; d < D; d++) scratch[size_t(r * D + d)] = to_acc<A>(src[r * stride + d]);
    ld = D;
    return scratch.data();
  }
}

// exp(x) for x <= 0 (scores minus a row's max or lse), in a loop the compiler vectorizes with the
// baseline instruction set: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
// polynomial (relative error < 2e-7, about 1.5 ulp), 2^n from the exponent bits; below -87 the
// result is 0 (exp(-87) = 1.6e-38 is the smallest normal float's neighbourhood).
inline float exp_nonpositive(float x) {
  const float magic = 12582912.0f; // 1.5 · 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + magic) - magic;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.0f ? 0.0f : p * two_n;
}

// p[j] = exp(s[j] - shift) for j < n, 0 for n <= j < cols.
void exp_shifted(float* p, const float* s, float shift, int64_t n, int64_t cols) {
  for (int64_t j = 0; j < n; j++) p[j] = exp_nonpositive(std::max(s[j] - shift, -100.0f));
  std::fill(p + n, p + cols, 0.0f);
}
void exp_shifted(double* p, const double* s, double shift, int64_t n, int64_t cols) {
  for (int64_t j = 0; j < n; j++) p[j] = std::exp(s[j] - shift); // f64: gradchecks, exact exp
  std::fill(p + n, p + cols, 0.0);
}

// Keys [k0, k0 + cols) of a document visible from its query row i.
inline int64_t visible_keys(bool causal, int64_t i, int64_t k0, int64_t cols) {
  return causal ? std::clamp<int64_t>(i + 1 - k0, 0, cols) : cols;
}

} // namespace

template <typename T>
void attention_fwd(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v,
                   const int32_t* cu_seqlens, const AttentionShape& s) {
  using A = acc_t<T>;
  const int64_t D = s.head_dim, Hq = s.q_heads, Hkv = s.kv_heads, group = Hq / Hkv;
  const std::vector<Block> blocks = make_blocks(cu_seqlens, s.docs, Hq, s.causal, false);
  const bool parallel = attention_work(cu_seqlens, s.docs, Hq, D) > kParallelWork;
#pragma omp parallel if (parallel)
  {
    std::vector<A> q_buf, k_buf, v_buf, scores(size_t(kBlockRows * kTile)), acc, row_max, row_sum;
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < blocks.size(); n++) {
      const Block& blk = blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t h = blk.head, g = h / group, rows = blk.end - blk.begin;
      int64_t ldq = 0, ldk = 0, ldv = 0;
      const A* qb = rows_as(q + ((start + blk.begin) * Hq + h) * D, rows, Hq * D, D, q_buf, ldq);
      acc.assign(size_t(rows * D), A(0));
      row_max.assign(size_t(rows), -INFINITY);
      row_sum.assign(size_t(rows), A(0));
      const int64_t n_keys = s.causal ? blk.end : len; // keys any row of the block can see
      for (int64_t k0 = 0; k0 < n_keys; k0 += kTile) {
        const int64_t cols = std::min(kTile, n_keys - k0);
        const A* kt = rows_as(k + ((start + k0) * Hkv + g) * D, cols, Hkv * D, D, k_buf, ldk);
        const A* vt = rows_as(v + ((start + k0) * Hkv + g) * D, cols, Hkv * D, D, v_buf, ldv);
        A* sc = scores.data();
        gemm(false, true, rows, cols, D, A(s.scale), qb, ldq, kt, ldk, A(0), sc, cols);
        for (int64_t r = 0; r < rows; r++) {
          A* row = sc + r * cols;
          A* o = acc.data() + r * D;
          const int64_t vis = visible_keys(s.causal, blk.begin + r, k0, cols);
          if (vis == 0) { // no key of this tile is visible: P = 0
            std::fill(row, row + cols, A(0));
            continue;
          }
          A mx = row_max[size_t(r)];
          for (int64_t j = 0; j < vis; j++) mx = std::max(mx, row[j]);
          const A correction = std::exp(row_max[size_t(r)] - mx); // 0 for the first tile
          exp_shifted(row, row, mx, vis, cols);
          A sum = 0;
          for (int64_t j = 0; j < vis; j++) sum += row[j];
          row_sum[size_t(r)] = row_sum[size_t(r)] * correction + sum;
          row_max[size_t(r)] = mx;
          if (correction != A(1))
            for (int64_t d = 0; d < D; d++) o[d] *= correction;
        }
        gemm(false, false, rows, D, cols, A(1), sc, cols, vt, ldv, A(1), acc.data(), D);
      }
      for (int64_t r = 0; r < rows; r++) {
        const int64_t row = (start + blk.begin + r) * Hq + h; // index of (token, head)
        const A inv = A(1) / row_sum[size_t(r)];
        for (int64_t d = 0; d < D; d++)
          out[row * D + d] = from_acc<T>(acc[size_t(r * D + d)] * inv);
        lse[row] = row_max[size_t(r)] + std::log(row_sum[size_t(r)]);
      }
    }
  }
}

template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const acc_t<T>* lse, const int32_t* cu_seqlens,
                   const AttentionShape& s) {
  using A = acc_t<T>;
  const int64_t D = s.head_dim, Hq = s.q_heads, Hkv = s.kv_heads, group = Hq / Hkv;
  const A scale = A(s.scale);
  const bool parallel = attention_work(cu_seqlens, s.docs, Hq, D) > kParallelWork;

  // delta[row] = dO_row · O_row, the softmax-backward row sums sum_j P_ij dP_ij.
  std::vector<A> delta(size_t(s.tokens * Hq));
#pragma omp parallel for if (s.tokens * Hq * D > 65536)
  for (int64_t row = 0; row < s.tokens * Hq; row++) {
    A acc = 0;
    for (int64_t d = 0; d < D; d++)
      acc += to_acc<A>(dout[row * D + d]) * to_acc<A>(out[row * D + d]);
    delta[size_t(row)] = acc;
  }

  // lse and delta of `rows` query rows of one head from (token, head) row `row0` on.
  auto gather_rows = [&](std::vector<A>& row_lse, std::vector<A>& row_delta, int64_t row0,
                         int64_t rows) {
    row_lse.resize(size_t(rows));
    row_delta.resize(size_t(rows));
    for (int64_t r = 0; r < rows; r++) {
      row_lse[size_t(r)] = lse[row0 + r * Hq];
      row_delta[size_t(r)] = delta[size_t(row0 + r * Hq)];
    }
  };

  // dS = P ⊙ (dP - delta) in place of dP, with P = exp(S - lse) recomputed in place of S; rows
  // r < rows of a [rows, cols] tile, row r seeing keys [k0, k0 + visible(r)).
  auto softmax_grad = [&](A* p, A* dp, int64_t rows, int64_t cols, const A* row_lse,
                          const A* row_delta, int64_t q0, int64_t k0) {
    for (int64_t r = 0; r < rows; r++) {
      A* pr = p + r * cols;
      A* dpr = dp + r * cols;
      const int64_t vis = visible_keys(s.causal, q0 + r, k0, cols);
      exp_shifted(pr, pr, row_lse[r], vis, cols);
      for (int64_t j = 0; j < cols; j++) dpr[j] = pr[j] * (dpr[j] - row_delta[r]);
    }
  };

  // dQ: blocks of query rows per query head (each dQ row is written by one block).
  const std::vector<Block> q_blocks = make_blocks(cu_seqlens, s.docs, Hq, s.causal, false);
#pragma omp parallel if (parallel)
  {
    std::vector<A> q_buf, do_buf, k_buf, v_buf, acc, row_lse, row_delta;
    std::vector<A> p(size_t(kBlockRows * kTile)), dp(size_t(kBlockRows * kTile));
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < q_blocks.size(); n++) {
      const Block& blk = q_blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t h = blk.head, g = h / group, rows = blk.end - blk.begin;
      const int64_t row0 = (start + blk.begin) * Hq + h;
      int64_t ldq = 0, ldo = 0, ldk = 0, ldv = 0;
      const A* qb = rows_as(q + row0 * D, rows, Hq * D, D, q_buf, ldq);
      const A* dob = rows_as(dout + row0 * D, rows, Hq * D, D, do_buf, ldo);
      gather_rows(row_lse, row_delta, row0, rows);
      acc.assign(size_t(rows * D), A(0));
      const int64_t n_keys = s.causal ? blk.end : len;
      for (int64_t k0 = 0; k0 < n_keys; k0 += kTile) {
        const int64_t cols = std::min(kTile, n_keys - k0);
        const A* kt = rows_as(k + ((start + k0) * Hkv + g) * D, cols, Hkv * D, D, k_buf, ldk);
        const A* vt = rows_as(v + ((start + k0) * Hkv + g) * D, cols, Hkv * D, D, v_buf, ldv);
        gemm(false, true, rows, cols, D, scale, qb, ldq, kt, ldk, A(0), p.data(), cols);
        gemm(false, true, rows, cols, D, A(1), dob, ldo, vt, ldv, A(0), dp.data(), cols);
        softmax_grad(p.data(), dp.data(), rows, cols, row_lse.data(), row_delta.data(), blk.begin,
                     k0);
        gemm(false, false, rows, D, cols, A(1), dp.data(), cols, kt, ldk, A(1), acc.data(), D);
      }
      for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < D; d++)
          dq[(row0 + r * Hq) * D + d] = from_acc<T>(scale * acc[size_t(r * D + d)]);
    }
  }

  // dK, dV: blocks of key rows per kv head; each block loops over the query heads of its group
  // and the query rows that see it, so the GQA sum happens in one place without atomics.
  const std::vector<Block> kv_blocks = make_blocks(cu_seqlens, s.docs, Hkv, s.causal, true);
#pragma omp parallel if (parallel)
  {
    std::vector<A> k_buf, v_buf, q_buf, do_buf, dk_acc, dv_acc, row_lse, row_delta;
    std::vector<A> p(size_t(kTile * kBlockRows)), dp(size_t(kTile * kBlockRows));
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < kv_blocks.size(); n++) {
      const Block& blk = kv_blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t g = blk.head, cols = blk.end - blk.begin;
      const int64_t kv_row0 = (start + blk.begin) * Hkv + g; // (token, kv head) of the first key
      int64_t ldk = 0, ldv = 0, ldq = 0, ldo = 0;
      const A* kb = rows_as(k + kv_row0 * D, cols, Hkv * D, D, k_buf, ldk);
      const A* vb = rows_as(v + kv_row0 * D, cols, Hkv * D, D, v_buf, ldv);
      dk_acc.assign(size_t(cols * D), A(0));
      dv_acc.assign(size_t(cols * D), A(0));
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t q0 = s.causal ? blk.begin : 0; q0 < len; q0 += kTile) {
          const int64_t rows = std::min(kTile, len - q0);
          const int64_t row0 = (start + q0) * Hq + h;
          const A* qt = rows_as(q + row0 * D, rows, Hq * D, D, q_buf, ldq);
          const A* dot = rows_as(dout + row0 * D, rows, Hq * D, D, do_buf, ldo);
          gather_rows(row_lse, row_delta, row0, rows);
          gemm(false, true, rows, cols, D, scale, qt, ldq, kb, ldk, A(0), p.data(), cols);
          gemm(false, true, rows, cols, D, A(1), dot, ldo, vb, ldv, A(0), dp.data(), cols);
          // dV += P^T dO before P turns into dS (softmax_grad writes dS into dp, keeps P in p).
          softmax_grad(p.data(), dp.data(), rows, cols, row_lse.data(), row_delta.data(), q0,
                       blk.begin);
          gemm(true, false, cols, D, rows, A(1), p.data(), cols, dot, ldo, A(1), dv_acc.data(), D);
          gemm(true, false, cols, D, rows, A(1), dp.data(), cols, qt, ldq, A(1), dk_acc.data(), D);
        }
      }
      for (int64_t jj = 0; jj < cols; jj++)
        for (int64_t d = 0; d < D; d++) {
          const int64_t at = (kv_row0 + jj * Hkv) * D + d;
          dk[at] = from_acc<T>(scale * dk_acc[size_t(jj * D + d)]);
          dv[at] = from_acc<T>(dv_acc[size_t(jj * D + d)]);
        }
    }
  }
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void attention_fwd<T>(T*, acc_t<T>*, const T*, const T*, const T*, const int32_t*,      \
                                 const AttentionShape&);                                           \
  template void attention_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,     \
                                 const acc_t<T>*, const int32_t*, const AttentionShape&);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
VLM_INSTANTIATE(bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
