#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace vlm::kernels::cpu {

namespace {

// Rows per work item: big enough that re-reading K/V per block is cheap next to the block's
// O(rows · keys · D) work, small enough that one long document still spreads over all threads.
constexpr int64_t kBlockRows = 64;

// A block of consecutive rows (queries, or keys in the dK/dV pass) of one document and one head.
struct Block {
  int64_t doc, head, begin, end; // rows [begin, end) relative to the document start
};

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

std::vector<Block> make_blocks(const int32_t* cu_seqlens, int64_t docs, int64_t heads) {
  std::vector<Block> blocks;
  for (int64_t b = 0; b < docs; b++) {
    int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t h = 0; h < heads; h++)
      for (int64_t r = 0; r < len; r += kBlockRows)
        blocks.push_back({b, h, r, std::min(len, r + kBlockRows)});
  }
  return blocks;
}

// dst[r, :] = src[r * stride, 0:D] converted to A, for r < rows ([rows, D]).
template <typename A, typename T>
void load_rows(std::vector<A>& dst, const T* src, int64_t rows, int64_t stride, int64_t D) {
  dst.resize(size_t(rows * D));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d = 0; d < D; d++) dst[size_t(r * D + d)] = to_acc<A>(src[r * stride + d]);
}

// The same rows transposed: dst[d, r] ([D, rows]), so that products with many rows vectorize.
template <typename A, typename T>
void load_cols(std::vector<A>& dst, const T* src, int64_t rows, int64_t stride, int64_t D) {
  dst.resize(size_t(rows * D));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d = 0; d < D; d++) dst[size_t(d * rows + r)] = to_acc<A>(src[r * stride + d]);
}

// out[j] = sum_d x[d] * cols[d * ld + j] for j < n: the dot products of x with n rows stored
// transposed. Each sum runs over d in order (so every caller gets bit-identical scores); the
// independent j lanes are what the compiler vectorizes.
template <typename A>
void dots(A* out, const A* x, const A* cols, int64_t ld, int64_t n, int64_t D) {
  std::fill(out, out + n, A(0));
  for (int64_t d = 0; d < D; d++) {
    const A xd = x[d];
    const A* col = cols + d * ld;
    for (int64_t j = 0; j < n; j++) out[j] += xd * col[j];
  }
}

// y += alpha * x
template <typename A> inline void axpy(A* y, A alpha, const A* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

} // namespace

template <typename T>
void attention_fwd(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v,
                   const int32_t* cu_seqlens, const AttentionShape& s) {
  using A = acc_t<T>;
  const int64_t D = s.head_dim, Hq = s.q_heads, Hkv = s.kv_heads, group = Hq / Hkv;
  const A scale = A(s.scale);
  const std::vector<Block> blocks = make_blocks(cu_seqlens, s.docs, Hq);
  const bool parallel = attention_work(cu_seqlens, s.docs, Hq, D) > kParallelWork;
#pragma omp parallel if (parallel)
  {
    std::vector<A> keys_t, values, query, scores, acc(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < blocks.size(); n++) {
      const Block& blk = blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t h = blk.head, g = h / group;
      const int64_t n_keys = s.causal ? blk.end : len; // keys any row of the block can see
      load_cols(keys_t, k + (start * Hkv + g) * D, n_keys, Hkv * D, D);
      load_rows(values, v + (start * Hkv + g) * D, n_keys, Hkv * D, D);
      scores.resize(size_t(n_keys));
      for (int64_t i = blk.begin; i < blk.end; i++) {
        const int64_t row = (start + i) * Hq + h; // index of (token, head)
        load_rows(query, q + row * D, 1, D, D);
        const int64_t visible = s.causal ? i + 1 : len;
        dots(scores.data(), query.data(), keys_t.data(), n_keys, visible, D);
        A max_score = -INFINITY;
        for (int64_t j = 0; j < visible; j++) {
          scores[size_t(j)] *= scale;
          max_score = std::max(max_score, scores[size_t(j)]);
        }
        A denom = 0;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < visible; j++) {
          const A p = std::exp(scores[size_t(j)] - max_score);
          denom += p;
          axpy(acc.data(), p, &values[size_t(j * D)], D);
        }
        const A inv = A(1) / denom;
        for (int64_t d = 0; d < D; d++) out[row * D + d] = from_acc<T>(acc[size_t(d)] * inv);
        lse[row] = max_score + std::log(denom);
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

  // dQ: blocks of query rows per query head (each dQ row is written by one block).
  const std::vector<Block> q_blocks = make_blocks(cu_seqlens, s.docs, Hq);
#pragma omp parallel if (parallel)
  {
    std::vector<A> keys, keys_t, values_t, query, grad_out, scores, dprobs;
    std::vector<A> acc(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < q_blocks.size(); n++) {
      const Block& blk = q_blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t h = blk.head, g = h / group;
      const int64_t n_keys = s.causal ? blk.end : len;
      load_rows(keys, k + (start * Hkv + g) * D, n_keys, Hkv * D, D);
      load_cols(keys_t, k + (start * Hkv + g) * D, n_keys, Hkv * D, D);
      load_cols(values_t, v + (start * Hkv + g) * D, n_keys, Hkv * D, D);
      scores.resize(size_t(n_keys));
      dprobs.resize(size_t(n_keys));
      for (int64_t i = blk.begin; i < blk.end; i++) {
        const int64_t row = (start + i) * Hq + h;
        load_rows(query, q + row * D, 1, D, D);
        load_rows(grad_out, dout + row * D, 1, D, D);
        const int64_t visible = s.causal ? i + 1 : len;
        dots(scores.data(), query.data(), keys_t.data(), n_keys, visible, D);
        dots(dprobs.data(), grad_out.data(), values_t.data(), n_keys, visible, D);
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < visible; j++) {
          const A p = std::exp(scale * scores[size_t(j)] - lse[row]);
          axpy(acc.data(), p * (dprobs[size_t(j)] - delta[size_t(row)]), &keys[size_t(j * D)], D);
        }
        for (int64_t d = 0; d < D; d++) dq[row * D + d] = from_acc<T>(scale * acc[size_t(d)]);
      }
    }
  }

  // dK, dV: blocks of key rows per kv head; each block loops over the query heads of its group
  // and the query rows that see it, so the GQA sum happens in one place without atomics.
  const std::vector<Block> kv_blocks = make_blocks(cu_seqlens, s.docs, Hkv);
#pragma omp parallel if (parallel)
  {
    std::vector<A> keys_t, values_t, query, grad_out, scores, dprobs, dk_acc, dv_acc;
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < kv_blocks.size(); n++) {
      const Block& blk = kv_blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t g = blk.head, rows = blk.end - blk.begin;
      const int64_t kv_row0 = (start + blk.begin) * Hkv + g; // (token, kv head) of the first key
      load_cols(keys_t, k + kv_row0 * D, rows, Hkv * D, D);
      load_cols(values_t, v + kv_row0 * D, rows, Hkv * D, D);
      scores.resize(size_t(rows));
      dprobs.resize(size_t(rows));
      dk_acc.assign(size_t(rows * D), A(0));
      dv_acc.assign(size_t(rows * D), A(0));
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t i = s.causal ? blk.begin : 0; i < len; i++) {
          const int64_t row = (start + i) * Hq + h;
          load_rows(query, q + row * D, 1, D, D);
          load_rows(grad_out, dout + row * D, 1, D, D);
          // Keys blk.begin + jj visible from query i.
          const int64_t visible = (s.causal ? std::min(blk.end, i + 1) : blk.end) - blk.begin;
          dots(scores.data(), query.data(), keys_t.data(), rows, visible, D);
          dots(dprobs.data(), grad_out.data(), values_t.data(), rows, visible, D);
          for (int64_t jj = 0; jj < visible; jj++) {
            const A p = std::exp(scale * scores[size_t(jj)] - lse[row]);
            axpy(&dv_acc[size_t(jj * D)], p, grad_out.data(), D);
            axpy(&dk_acc[size_t(jj * D)], p * (dprobs[size_t(jj)] - delta[size_t(row)]),
                 query.data(), D);
          }
        }
      }
      for (int64_t jj = 0; jj < rows; jj++)
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
