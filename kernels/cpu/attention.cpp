#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <omp.h>
#include <vector>

#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/lane_reduce.h"

// Flash attention on the CPU. Query rows x key rows tiles with the softmax kept online per query
// row (running max and sum), so no [T, T] matrix is ever held. Every product is a run of register
// tiles: 6 rows x 2 SIMD vectors of C held in registers while the sum over k streams one operand
// row by row (broadcasts) and the other from a copy packed once per document and head in the
// order the tile reads it (the BLAS "packed panel" idea, without BLAS's per-call packing and
// zeroing of C, 18% of the time when these small products went through OpenBLAS). The vectors are
// GCC vector types: AVX2 + FMA on x86-64-v3, NEON on ARM.
//
// Determinism: work items and every sum's order depend only on the shapes, never on the thread
// count. The forward's items are blocks of query rows of one document and head. The backward's
// items are whole (document, query head) pairs, each computing its dQ and its own dK/dV (five
// products per tile, as flash attention 2, with no atomics); the query heads sharing a kv head
// are summed afterwards in head order. With more threads than such pairs can keep busy it splits
// instead: dK/dV per (document, kv head, block of keys), dQ per (document, query head, block of
// queries), in the same sums and order, so both plans give the same bits.
namespace vlm::kernels::cpu {

namespace {

// Tile sizes (query rows x keys), measured best on Zen 3 at 4096 tokens, head dims 64 and 128;
// the backward holds four [rows, keys] tiles.
constexpr int64_t kForwardRows = 128, kForwardKeys = 256;
constexpr int64_t kBackwardRows = 128, kBackwardKeys = 128;
constexpr int kMicroRows = 6; // rows of a register tile

typedef float Vec8f __attribute__((vector_size(32)));
typedef double Vec4d __attribute__((vector_size(32)));
template <typename A> struct VecOf;
template <> struct VecOf<float> { using type = Vec8f; };
template <> struct VecOf<double> { using type = Vec4d; };
template <typename A> using Vec = typename VecOf<A>::type;
template <typename A> constexpr int64_t kLanes = 32 / sizeof(A);
template <typename A> constexpr int64_t kPanel = 2 * kLanes<A>; // columns of a register tile

template <typename A> inline Vec<A> load(const A* p) {
  Vec<A> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename A> inline void store(A* p, Vec<A> v) { std::memcpy(p, &v, sizeof v); }

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// c[i][0, kPanel) (+)= sum_k a[i·rs + k·cs] · b[k][0, kPanel) for i < MR. b is a packed panel
// (kPanel values per k, contiguous); the sum over k is kept in registers and added to c once.
template <typename A, int MR>
void register_tile(int64_t K, const A* a, int64_t rs, int64_t cs, const A* b, A* c, int64_t ldc,
                   bool add) {
  constexpr int64_t L = kLanes<A>;
  Vec<A> lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) lo[i] = hi[i] = Vec<A>{};
  for (int64_t k = 0; k < K; k++, a += cs, b += 2 * L) {
    const Vec<A> b0 = load(b), b1 = load(b + L);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      const A x = a[i * rs];
      lo[i] += x * b0;
      hi[i] += x * b1;
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) {
    A* ci = c + i * ldc;
    if (add) {
      lo[i] += load(ci);
      hi[i] += load(ci + L);
    }
    store(ci, lo[i]);
    store(ci + L, hi[i]);
  }
}

// Which k row i of a product sums under a causal mask: k in [i + from, i + to] (a register
// tile takes the union of its rows'). The default is every k; the skipped terms are zeros.
struct SumRange {
  int64_t from = INT64_MIN / 2, to = INT64_MAX / 2;
};

// c[i][0, kPanel) (+)= sum_k a[i·rs + k·cs] · b[k][0, kPanel) for i < M, k < K within `range`:
// register tiles down the rows, so the panel b is read from L1 by all of them.
template <typename A>
void panel_product(int64_t M, int64_t K, const A* a, int64_t rs, int64_t cs, const A* b, A* c,
                   int64_t ldc, bool add, SumRange range = {}) {
  for (int64_t i = 0; i < M; i += kMicroRows) {
    const int64_t mr = std::min<int64_t>(kMicroRows, M - i);
    const int64_t k0 = std::clamp<int64_t>(i + range.from, 0, K);
    const int64_t k1 = std::clamp<int64_t>(i + mr - 1 + range.to + 1, k0, K);
    if (add && k1 == k0) continue;
    const A* ai = a + i * rs + k0 * cs;
    const A* bk = b + k0 * kPanel<A>;
    A* ci = c + i * ldc;
    switch (mr) {
    case 6: register_tile<A, 6>(k1 - k0, ai, rs, cs, bk, ci, ldc, add); break;
    case 5: register_tile<A, 5>(k1 - k0, ai, rs, cs, bk, ci, ldc, add); break;
    case 4: register_tile<A, 4>(k1 - k0, ai, rs, cs, bk, ci, ldc, add); break;
    case 3: register_tile<A, 3>(k1 - k0, ai, rs, cs, bk, ci, ldc, add); break;
    case 2: register_tile<A, 2>(k1 - k0, ai, rs, cs, bk, ci, ldc, add); break;
    default: register_tile<A, 1>(k1 - k0, ai, rs, cs, bk, ci, ldc, add); break;
    }
  }
}

// Scratch aligned to a cache line: packed panels and tiles are read in 64-byte rows.
template <typename A> struct CacheLineAllocator {
  using value_type = A;
  CacheLineAllocator() = default;
  template <typename B> CacheLineAllocator(const CacheLineAllocator<B>&) {}
  A* allocate(size_t n) {
    return static_cast<A*>(::operator new(n * sizeof(A), std::align_val_t(64)));
  }
  void deallocate(A* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};
template <typename A> using Buffer = std::vector<A, CacheLineAllocator<A>>;

// Packed copies of n rows of D values (`stride` apart), for the two ways a product reads them:
// as keys (x · y^T: panels of kPanel rows, [n / kPanel][D][kPanel], rows past n zero) and as
// values (p · y: panels of kPanel columns, [D / kPanel][n][kPanel], columns past D zero).
template <typename A, typename T>
void pack_as_keys(A* dst, const T* src, int64_t n, int64_t stride, int64_t D) {
  constexpr int64_t NR = kPanel<A>;
  for (int64_t p = 0; p < n; p += NR)
    for (int64_t d = 0; d < D; d++, dst += NR)
      for (int64_t j = 0; j < NR; j++)
        dst[j] = p + j < n ? to_acc<A>(src[(p + j) * stride + d]) : A(0);
}
template <typename A, typename T>
void pack_as_values(A* dst, const T* src, int64_t n, int64_t stride, int64_t D) {
  constexpr int64_t NR = kPanel<A>;
  for (int64_t c = 0; c < D; c += NR)
    for (int64_t j = 0; j < n; j++, dst += NR)
      for (int64_t dd = 0; dd < NR; dd++)
        dst[dd] = c + dd < D ? to_acc<A>(src[j * stride + c + dd]) : A(0);
}
inline int64_t keys_size(int64_t n, int64_t D, int64_t NR) { return round_up(n, NR) * D; }
inline int64_t values_size(int64_t n, int64_t D, int64_t NR) { return n * round_up(D, NR); }

// One [T, H, D] tensor packed per (document, head), as keys or as values.
template <typename A> struct PackedHeads {
  Buffer<A> data;
  std::vector<int64_t> doc_offset, head_size; // per document
  const A* at(int64_t doc, int64_t head) const {
    return data.data() + doc_offset[size_t(doc)] + head * head_size[size_t(doc)];
  }
};

template <typename A, typename T>
PackedHeads<A> pack_heads(const T* x, const int32_t* cu_seqlens, int64_t docs, int64_t heads,
                          int64_t D, bool as_keys, bool parallel) {
  constexpr int64_t NR = kPanel<A>;
  PackedHeads<A> packed;
  int64_t total = 0;
  for (int64_t b = 0; b < docs; b++) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    packed.doc_offset.push_back(total);
    packed.head_size.push_back(as_keys ? keys_size(len, D, NR) : values_size(len, D, NR));
    total += heads * packed.head_size.back();
  }
  packed.data.resize(size_t(total));
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (parallel)
  for (int64_t b = 0; b < docs; b++)
    for (int64_t h = 0; h < heads; h++) {
      const int64_t start = cu_seqlens[b], len = cu_seqlens[b + 1] - start;
      A* dst = packed.data.data() + packed.doc_offset[size_t(b)] + h * packed.head_size[size_t(b)];
      const T* src = x + (start * heads + h) * D;
      if (as_keys)
        pack_as_keys(dst, src, len, heads * D, D);
      else
        pack_as_values(dst, src, len, heads * D, D);
    }
  return packed;
}

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
  int64_t work;                  // query rows x keys it visits (for the schedule)
};

// Blocks of query rows see the keys up to their end (causal); blocks of keys are seen by the
// rows from their beginning.
enum class BlockOf { queries, keys };

// Blocks of `rows` rows (at most) of every document and head, the largest first (causal query
// blocks near a document's end see the most keys), which balances the dynamic schedule.
std::vector<Block> make_blocks(const int32_t* cu_seqlens, int64_t docs, int64_t heads, bool causal,
                               int64_t rows, BlockOf of = BlockOf::queries) {
  std::vector<Block> blocks;
  for (int64_t b = 0; b < docs; b++) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t h = 0; h < heads; h++)
      for (int64_t r = 0, end = 0; r < len; r = end) {
        end = std::min(len, r + rows);
        const int64_t seen = !causal ? len : of == BlockOf::queries ? end : len - r;
        blocks.push_back({b, h, r, end, (end - r) * seen});
      }
  }
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.work > b.work; });
  return blocks;
}

// p[j] = exp(s[j] - shift) for j < n, 0 for n <= j < cols.
template <typename A> void exp_shifted(A* p, const A* s, A shift, int64_t n, int64_t cols) {
  for (int64_t j = 0; j < n; j++) p[j] = exp_nonpositive(s[j] - shift);
  std::fill(p + n, p + cols, A(0));
}

// Keys [k0, k0 + cols) of a document visible from its query row i.
inline int64_t visible_keys(bool causal, int64_t i, int64_t k0, int64_t cols) {
  return causal ? std::clamp<int64_t>(i + 1 - k0, 0, cols) : cols;
}

// dst[r][0, D) = alpha · src row r (rows `stride` apart), r < rows, in A.
template <typename A, typename T>
void gather_rows(A* dst, const T* src, int64_t rows, int64_t stride, int64_t D, A alpha) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d = 0; d < D; d++) dst[r * D + d] = alpha * to_acc<A>(src[r * stride + d]);
}

// The first row of a query block starting at q0 that sees key k (causal: row k - q0).
inline int64_t first_row_seeing(bool causal, int64_t q0, int64_t k) {
  return causal ? std::max<int64_t>(0, k - q0) : 0;
}

} // namespace

template <typename T>
void attention_fwd(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v,
                   const int32_t* cu_seqlens, const AttentionShape& s) {
  using A = acc_t<T>;
  constexpr int64_t NR = kPanel<A>, R = kForwardRows, C = kForwardKeys;
  const int64_t D = s.head_dim, Dp = round_up(D, NR), Hq = s.q_heads, Hkv = s.kv_heads;
  const int64_t group = Hq / Hkv;
  const bool parallel = attention_work(cu_seqlens, s.docs, Hq, D) > kParallelWork;
  const PackedHeads<A> k_keys = pack_heads<A>(k, cu_seqlens, s.docs, Hkv, D, true, parallel);
  const PackedHeads<A> v_values = pack_heads<A>(v, cu_seqlens, s.docs, Hkv, D, false, parallel);
  const std::vector<Block> blocks = make_blocks(cu_seqlens, s.docs, Hq, s.causal, R);
#pragma omp parallel if (parallel)
  {
    Buffer<A> qs(size_t(R * D)), scores(size_t(R * C)), acc(size_t(R * Dp));
    std::vector<A> row_max(R), row_sum(R);
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < blocks.size(); n++) {
      const Block& blk = blocks[n];
      const int64_t start = cu_seqlens[blk.doc], len = cu_seqlens[blk.doc + 1] - start;
      const int64_t h = blk.head, g = h / group, q0 = blk.begin, rows = blk.end - q0;
      const int64_t row0 = (start + q0) * Hq + h; // (token, head) of the first row
      gather_rows(qs.data(), q + row0 * D, rows, Hq * D, D, A(s.scale));
      const A* kk = k_keys.at(blk.doc, g);
      const A* vv = v_values.at(blk.doc, g);
      std::fill(acc.begin(), acc.end(), A(0));
      std::fill(row_max.begin(), row_max.end(), -INFINITY);
      std::fill(row_sum.begin(), row_sum.end(), A(0));
      A* sc = scores.data();
      const int64_t n_keys = s.causal ? blk.end : len; // keys any row of the block can see
      for (int64_t k0 = 0; k0 < n_keys; k0 += C) {
        const int64_t cols = std::min(C, n_keys - k0);
        for (int64_t j = 0; j < cols; j += NR) { // S = (scale Q) K^T where a row sees a key
          const int64_t r0 = first_row_seeing(s.causal, q0, k0 + j);
          if (r0 < rows)
            panel_product(rows - r0, D, qs.data() + r0 * D, D, 1, kk + (k0 + j) * D,
                          sc + r0 * C + j, C, false);
        }
        for (int64_t r = 0; r < rows; r++) {
          A* row = sc + r * C;
          A* o = acc.data() + r * Dp;
          const int64_t vis = visible_keys(s.causal, q0 + r, k0, cols);
          if (vis == 0) { // no key of this tile is visible: P = 0
            std::fill(row, row + cols, A(0));
            continue;
          }
          const A mx = lane_max(
              vis, [&](int64_t j) { return row[j]; }, row_max[size_t(r)]);
          const A correction = std::exp(row_max[size_t(r)] - mx); // 0 for the first tile
          exp_shifted(row, row, mx, vis, cols);
          const A sum = lane_sum<A>(vis, [&](int64_t j) { return row[j]; });
          row_sum[size_t(r)] = row_sum[size_t(r)] * correction + sum;
          row_max[size_t(r)] = mx;
          if (correction != A(1))
            for (int64_t d = 0; d < Dp; d++) o[d] *= correction;
        }
        // O += P V; under a causal mask row r sums keys k0 + j <= q0 + r only.
        const SumRange seen = s.causal ? SumRange{INT64_MIN / 2, q0 - k0} : SumRange{};
        for (int64_t c = 0; c < Dp; c += NR)
          panel_product(rows, cols, sc, C, 1, vv + c * len + k0 * NR, acc.data() + c, Dp, true,
                        seen);
      }
      for (int64_t r = 0; r < rows; r++) {
        const int64_t row = row0 + r * Hq;
        const A inv = A(1) / row_sum[size_t(r)];
        for (int64_t d = 0; d < D; d++)
          out[row * D + d] = from_acc<T>(acc[size_t(r * Dp + d)] * inv);
        lse[row] = row_max[size_t(r)] + std::log(row_sum[size_t(r)]);
      }
    }
  }
}

namespace {

// What both backward plans read: the inputs, packed K/V of every (document, kv head), and
// delta[row] = dO_row · O_row (the softmax-backward row sums sum_j P_ij dP_ij).
template <typename T> struct BackwardInputs {
  using A = acc_t<T>;
  const T *q, *dout;
  const A* lse;
  const int32_t* cu_seqlens;
  const AttentionShape& shape;
  int64_t D, Dp, group;
  A scale;
  std::vector<A> delta;
  PackedHeads<A> k_keys, k_values, v_keys;
};

// One block of at most kBackwardRows query rows of a (document, query head), gathered for the
// products, with the [rows, keys] tiles P and dS of the key tile being worked on.
template <typename T> struct QueryBlock {
  using A = acc_t<T>;
  static constexpr int64_t R = kBackwardRows, C = kBackwardKeys;
  Buffer<A> qs, dos, q_values, do_values, p, ds;
  std::vector<A> lse, delta;
  int64_t doc = 0, start = 0, len = 0, head = 0, q0 = 0, rows = 0, row0 = 0;

  QueryBlock(int64_t D, int64_t Dp)
      : qs(size_t(R * D)), dos(size_t(R * D)), q_values(size_t(R * Dp)), do_values(size_t(R * Dp)),
        p(size_t(R * C)), ds(size_t(R * C)), lse(R), delta(R) {}

  void load(const BackwardInputs<T>& in, int64_t doc_, int64_t head_, int64_t q0_) {
    const int64_t D = in.D, Hq = in.shape.q_heads;
    doc = doc_, head = head_, q0 = q0_;
    start = in.cu_seqlens[doc], len = in.cu_seqlens[doc + 1] - start;
    rows = std::min(R, len - q0);
    row0 = (start + q0) * Hq + head; // (token, head) of the first row
    gather_rows(qs.data(), in.q + row0 * D, rows, Hq * D, D, in.scale);
    gather_rows(dos.data(), in.dout + row0 * D, rows, Hq * D, D, A(1));
    pack_as_values(q_values.data(), in.q + row0 * D, rows, Hq * D, D);
    pack_as_values(do_values.data(), in.dout + row0 * D, rows, Hq * D, D);
    for (int64_t r = 0; r < rows; r++) {
      lse[size_t(r)] = in.lse[row0 + r * Hq];
      delta[size_t(r)] = in.delta[size_t(row0 + r * Hq)];
    }
  }
  // Keys any row of the block sees.
  int64_t keys_seen(bool causal) const { return causal ? q0 + rows : len; }
  int64_t kv_head(const BackwardInputs<T>& in) const { return head / in.group; }
};

// P = exp(S - lse) and dS = P ⊙ (dP - delta) of the block's rows and keys [k0, k0 + cols), with
// S = (scale Q) K^T and dP = dO V^T; both 0 where the mask hides the key.
template <typename T>
void probs_and_grads(const BackwardInputs<T>& in, QueryBlock<T>& qb, int64_t k0, int64_t cols) {
  using A = acc_t<T>;
  constexpr int64_t NR = kPanel<A>, C = kBackwardKeys;
  const int64_t D = in.D, rows = qb.rows;
  const bool causal = in.shape.causal;
  const A* kk = in.k_keys.at(qb.doc, qb.kv_head(in));
  const A* vk = in.v_keys.at(qb.doc, qb.kv_head(in));
  for (int64_t j = 0; j < cols; j += NR) {
    const int64_t r0 = first_row_seeing(causal, qb.q0, k0 + j);
    if (r0 >= rows) continue;
    panel_product(rows - r0, D, qb.qs.data() + r0 * D, D, 1, kk + (k0 + j) * D,
                  qb.p.data() + r0 * C + j, C, false);
    panel_product(rows - r0, D, qb.dos.data() + r0 * D, D, 1, vk + (k0 + j) * D,
                  qb.ds.data() + r0 * C + j, C, false);
  }
  for (int64_t r = 0; r < rows; r++) {
    A* pr = qb.p.data() + r * C;
    A* dsr = qb.ds.data() + r * C;
    const int64_t vis = visible_keys(causal, qb.q0 + r, k0, cols);
    exp_shifted(pr, pr, qb.lse[size_t(r)], vis, cols);
    for (int64_t j = 0; j < vis; j++) dsr[j] = pr[j] * (dsr[j] - qb.delta[size_t(r)]);
    std::fill(dsr + vis, dsr + cols, A(0));
  }
}

// dV += P^T dO and dK += dS^T Q (unscaled) for keys [k0, k0 + cols): dk, dv are their rows,
// [cols, Dp]. Under a causal mask key j sums rows q0 + r >= k0 + j only.
template <typename T>
void add_key_grads(const BackwardInputs<T>& in, const QueryBlock<T>& qb, int64_t k0, int64_t cols,
                   acc_t<T>* dk, acc_t<T>* dv) {
  constexpr int64_t NR = kPanel<acc_t<T>>, C = kBackwardKeys;
  const int64_t Dp = in.Dp, rows = qb.rows;
  const SumRange rows_seeing = in.shape.causal ? SumRange{k0 - qb.q0, INT64_MAX / 2} : SumRange{};
  for (int64_t c = 0; c < Dp; c += NR) {
    panel_product(cols, rows, qb.p.data(), 1, C, qb.do_values.data() + c * rows, dv + c, Dp, true,
                  rows_seeing);
    panel_product(cols, rows, qb.ds.data(), 1, C, qb.q_values.data() + c * rows, dk + c, Dp, true,
                  rows_seeing);
  }
}

// dQ += dS K (unscaled) into the block's [rows, Dp] accumulator. Under a causal mask row r sums
// keys k0 + j <= q0 + r only.
template <typename T>
void add_query_grad(const BackwardInputs<T>& in, const QueryBlock<T>& qb, int64_t k0, int64_t cols,
                    acc_t<T>* dq_acc) {
  constexpr int64_t NR = kPanel<acc_t<T>>, C = kBackwardKeys;
  const int64_t Dp = in.Dp;
  const acc_t<T>* kv = in.k_values.at(qb.doc, qb.kv_head(in));
  const SumRange keys_seen = in.shape.causal ? SumRange{INT64_MIN / 2, qb.q0 - k0} : SumRange{};
  for (int64_t c = 0; c < Dp; c += NR)
    panel_product(qb.rows, cols, qb.ds.data(), C, 1, kv + c * qb.len + k0 * NR, dq_acc + c, Dp,
                  true, keys_seen);
}

// The block's dQ rows: for every key tile it sees, P and dS, then dQ += dS K; with dk_head and
// dv_head (the head's [len, Dp] sums, per-head plan) also dK and dV of those keys.
template <typename T>
void query_block_grads(const BackwardInputs<T>& in, QueryBlock<T>& qb, acc_t<T>* dq_acc, T* dq,
                       acc_t<T>* dk_head = nullptr, acc_t<T>* dv_head = nullptr) {
  using A = acc_t<T>;
  constexpr int64_t C = kBackwardKeys;
  const int64_t D = in.D, Dp = in.Dp, Hq = in.shape.q_heads;
  std::fill(dq_acc, dq_acc + kBackwardRows * Dp, A(0));
  const int64_t n_keys = qb.keys_seen(in.shape.causal);
  for (int64_t k0 = 0; k0 < n_keys; k0 += C) {
    const int64_t cols = std::min(C, n_keys - k0);
    probs_and_grads(in, qb, k0, cols);
    if (dk_head) add_key_grads(in, qb, k0, cols, dk_head + k0 * Dp, dv_head + k0 * Dp);
    add_query_grad(in, qb, k0, cols, dq_acc);
  }
  for (int64_t r = 0; r < qb.rows; r++)
    for (int64_t d = 0; d < D; d++)
      dq[(qb.row0 + r * Hq) * D + d] = from_acc<T>(in.scale * dq_acc[size_t(r * Dp + d)]);
}

// The per-head plan (five products per tile) has only documents x query heads items; when the
// largest would keep the other threads waiting, the split plan gives every block of keys (dK,
// dV) and of queries (dQ) its own item, at the price of computing P and dS twice (seven
// products per tile, 1.5-1.6x the time when both are balanced, measured at 2 threads on Zen 3).
bool split_backward(const std::vector<Block>& per_head, int64_t threads) {
  int64_t total = 0;
  for (const Block& item : per_head) total += item.work;
  return !per_head.empty() && 5 * per_head.front().work * threads > 8 * total;
}

// dK, dV of one (document, kv head, block of keys) for the split plan: for each query head of
// the group in order, its own sum over the query blocks that see the keys, then the group's sum
// in head order (the per-head plan's sums and order, so both give the same bits).
template <typename T>
void key_block_grads(const BackwardInputs<T>& in, const Block& blk, QueryBlock<T>& qb,
                     acc_t<T>* dk_head, acc_t<T>* dv_head, acc_t<T>* dk_sum, acc_t<T>* dv_sum,
                     T* dk, T* dv) {
  using A = acc_t<T>;
  const int64_t D = in.D, Dp = in.Dp, Hkv = in.shape.kv_heads, k0 = blk.begin;
  const int64_t n = (blk.end - k0) * Dp, start = in.cu_seqlens[blk.doc];
  const int64_t len = in.cu_seqlens[blk.doc + 1] - start;
  const bool causal = in.shape.causal;
  std::fill(dk_sum, dk_sum + n, A(0));
  std::fill(dv_sum, dv_sum + n, A(0));
  for (int64_t h = blk.head * in.group; h < (blk.head + 1) * in.group; h++) {
    std::fill(dk_head, dk_head + n, A(0));
    std::fill(dv_head, dv_head + n, A(0));
    // Query blocks start at multiples of kBackwardRows; causal rows before k0 see none of it.
    for (int64_t q0 = causal ? k0 / kBackwardRows * kBackwardRows : 0; q0 < len;
         q0 += kBackwardRows) {
      qb.load(in, blk.doc, h, q0);
      const int64_t n_keys = qb.keys_seen(causal);
      if (k0 >= n_keys) continue;
      const int64_t cols = std::min(kBackwardKeys, n_keys - k0);
      probs_and_grads(in, qb, k0, cols);
      add_key_grads(in, qb, k0, cols, dk_head, dv_head);
    }
    for (int64_t i = 0; i < n; i++) dk_sum[i] += dk_head[i], dv_sum[i] += dv_head[i];
  }
  for (int64_t t = k0; t < blk.end; t++)
    for (int64_t d = 0; d < D; d++) {
      const int64_t at = ((start + t) * Hkv + blk.head) * D + d;
      dk[at] = from_acc<T>(in.scale * dk_sum[(t - k0) * Dp + d]);
      dv[at] = from_acc<T>(dv_sum[(t - k0) * Dp + d]);
    }
}

} // namespace

template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const acc_t<T>* lse, const int32_t* cu_seqlens,
                   const AttentionShape& s) {
  using A = acc_t<T>;
  constexpr int64_t NR = kPanel<A>, R = kBackwardRows, C = kBackwardKeys;
  const int64_t D = s.head_dim, Dp = round_up(D, NR), Hq = s.q_heads, Hkv = s.kv_heads;
  const bool parallel = attention_work(cu_seqlens, s.docs, Hq, D) > kParallelWork;

  BackwardInputs<T> in{q, dout, lse, cu_seqlens, s, D, Dp, Hq / Hkv, A(s.scale), {}, {}, {}, {}};
  in.delta.resize(size_t(s.tokens * Hq));
#pragma omp parallel for if (s.tokens * Hq * D > 65536)
  for (int64_t row = 0; row < s.tokens * Hq; row++) {
    A acc = 0;
    for (int64_t d = 0; d < D; d++)
      acc += to_acc<A>(dout[row * D + d]) * to_acc<A>(out[row * D + d]);
    in.delta[size_t(row)] = acc;
  }
  in.k_keys = pack_heads<A>(k, cu_seqlens, s.docs, Hkv, D, true, parallel);
  in.k_values = pack_heads<A>(k, cu_seqlens, s.docs, Hkv, D, false, parallel);
  in.v_keys = pack_heads<A>(v, cu_seqlens, s.docs, Hkv, D, true, parallel);

  const std::vector<Block> per_head =
      make_blocks(cu_seqlens, s.docs, Hq, s.causal, s.tokens, BlockOf::queries);
  if (parallel && split_backward(per_head, omp_get_max_threads())) {
    const std::vector<Block> key_blocks =
        make_blocks(cu_seqlens, s.docs, Hkv, s.causal, C, BlockOf::keys);
    const std::vector<Block> query_blocks =
        make_blocks(cu_seqlens, s.docs, Hq, s.causal, R, BlockOf::queries);
#pragma omp parallel
    {
      QueryBlock<T> qb(D, Dp);
      Buffer<A> dq_acc(size_t(R * Dp)), dk_head(size_t(C * Dp)), dv_head(size_t(C * Dp)),
          dk_sum(size_t(C * Dp)), dv_sum(size_t(C * Dp));
#pragma omp for schedule(dynamic, 1) nowait
      for (size_t n = 0; n < key_blocks.size(); n++)
        key_block_grads(in, key_blocks[n], qb, dk_head.data(), dv_head.data(), dk_sum.data(),
                        dv_sum.data(), dk, dv);
#pragma omp for schedule(dynamic, 1)
      for (size_t n = 0; n < query_blocks.size(); n++) {
        const Block& blk = query_blocks[n];
        qb.load(in, blk.doc, blk.head, blk.begin);
        query_block_grads(in, qb, dq_acc.data(), dq);
      }
    }
    return;
  }

  // The per-head plan: dK and dV of each query head, [doc][head][token of doc][Dp] (2 · T · Hq ·
  // Dp values; the price of a deterministic GQA sum without atomics), summed over a group below.
  Buffer<A> dk_part(size_t(s.tokens * Hq * Dp)), dv_part(size_t(s.tokens * Hq * Dp));
#pragma omp parallel if (parallel)
  {
    QueryBlock<T> qb(D, Dp);
    Buffer<A> dq_acc(size_t(R * Dp));
#pragma omp for schedule(dynamic, 1)
    for (size_t n = 0; n < per_head.size(); n++) {
      const Block& item = per_head[n];
      const int64_t start = cu_seqlens[item.doc], len = cu_seqlens[item.doc + 1] - start;
      A* dk_h = dk_part.data() + (start * Hq + item.head * len) * Dp;
      A* dv_h = dv_part.data() + (start * Hq + item.head * len) * Dp;
      std::fill(dk_h, dk_h + len * Dp, A(0));
      std::fill(dv_h, dv_h + len * Dp, A(0));
      for (int64_t q0 = 0; q0 < len; q0 += R) {
        qb.load(in, item.doc, item.head, q0);
        query_block_grads(in, qb, dq_acc.data(), dq, dk_h, dv_h);
      }
    }
  }

  // dK, dV of a kv head: the sum over its query heads, in head order.
  const int64_t group = in.group;
#pragma omp parallel for if (parallel)
  for (int64_t t = 0; t < s.tokens; t++) {
    const int64_t b = std::upper_bound(cu_seqlens, cu_seqlens + s.docs + 1, t) - cu_seqlens - 1;
    const int64_t start = cu_seqlens[b], len = cu_seqlens[b + 1] - start;
    for (int64_t g = 0; g < Hkv; g++)
      for (int64_t d = 0; d < D; d++) {
        A sum_k = 0, sum_v = 0;
        for (int64_t h = g * group; h < (g + 1) * group; h++) {
          const size_t at = size_t((start * Hq + h * len + t - start) * Dp + d);
          sum_k += dk_part[at];
          sum_v += dv_part[at];
        }
        dk[(t * Hkv + g) * D + d] = from_acc<T>(in.scale * sum_k);
        dv[(t * Hkv + g) * D + d] = from_acc<T>(sum_v);
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
