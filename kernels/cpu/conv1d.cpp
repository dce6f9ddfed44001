#include "kernels/conv1d.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/fast_exp.h"

namespace vlm::kernels::cpu {

namespace {

// Below this many multiply-adds the loops run single-threaded (thread start-up would dominate).
constexpr int64_t kParallelMin = 32768;
// The backward's weight-gradient sums use at most this many token blocks of at least kTile
// tokens; the split depends only on the token count, so dw is the same for any thread count.
constexpr int64_t kMaxTokenBlocks = 128;
// Tokens whose dL/du the backward keeps at a time (plus the K - 1 after them that dx reads).
constexpr int64_t kTile = 32;
// Channels summed at once in a fixed-size accumulator (vectorizable across channels).
constexpr int64_t kLanes = 64;

// Start of the document that holds token t: the last b with cu[b] <= t (empty documents share
// their start with the next one, which is the one holding t).
int64_t doc_start(const int32_t* cu, int64_t docs, int64_t t) {
  return *(std::upper_bound(cu, cu + docs + 1, int32_t(t)) - 1);
}
// End (exclusive) of the document that holds token t.
int64_t doc_end(const int32_t* cu, int64_t docs, int64_t t) {
  return *std::upper_bound(cu, cu + docs + 1, int32_t(t));
}

// w [C, K] in acc_t<T>, transposed to [K, C] so that one tap's weights are contiguous.
template <typename T> std::vector<acc_t<T>> taps_by_channel(const T* w, int64_t C, int64_t K) {
  std::vector<acc_t<T>> wt(size_t(K * C));
  for (int64_t c = 0; c < C; c++)
    for (int64_t i = 0; i < K; i++) wt[i * C + c] = to_acc<acc_t<T>>(w[c * K + i]);
  return wt;
}

// The pre-activations u[t, c0 .. c0 + n) = Σ_{i >= first} w[c, i] · x[t - (K-1) + i, c] into
// u[0 .. n), taps in increasing order (forward and backward sum alike).
template <typename T>
void pre_activation(acc_t<T>* u, const T* x, const acc_t<T>* wt, int64_t t, int64_t first,
                    int64_t c0, int64_t n, int64_t C, int64_t K) {
  using A = acc_t<T>;
  for (int64_t c = 0; c < n; c++) u[c] = A(0);
  for (int64_t i = first; i < K; i++) {
    const T* xr = x + (t - (K - 1) + i) * C + c0;
    const A* wr = wt + i * C + c0;
    for (int64_t c = 0; c < n; c++) u[c] += wr[c] * to_acc<A>(xr[c]);
  }
}

// The first tap of token t that reads inside its document (earlier ones read zeros).
int64_t first_tap(const int32_t* cu, int64_t docs, int64_t t, int64_t K) {
  return std::max<int64_t>(0, (K - 1) - (t - doc_start(cu, docs, t)));
}

// du[(t - t0) * C + c] = dL/du[t, c] for t in [t0, t1): dy, times silu'(u) with u recomputed.
template <typename T>
void tile_du(acc_t<T>* du, const T* dy, const T* x, const acc_t<T>* wt, const int32_t* cu,
             int64_t docs, int64_t t0, int64_t t1, int64_t C, int64_t K, bool silu) {
  using A = acc_t<T>;
  A u[kLanes];
  for (int64_t t = t0; t < t1; t++) {
    A* dur = du + (t - t0) * C;
    const T* dyr = dy + t * C;
    if (!silu) {
      for (int64_t c = 0; c < C; c++) dur[c] = to_acc<A>(dyr[c]);
      continue;
    }
    const int64_t first = first_tap(cu, docs, t, K);
    for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
      const int64_t n = std::min(kLanes, C - c0);
      pre_activation<T>(u, x, wt, t, first, c0, n, C, K);
      for (int64_t c = 0; c < n; c++) {
        const A s = sigmoid(u[c]);
        dur[c0 + c] = to_acc<A>(dyr[c0 + c]) * s * (A(1) + u[c] * (A(1) - s));
      }
    }
  }
}

// dx[s, c] = Σ_i w[c, i] · du[s + (K-1) - i, c] over the taps whose token s + (K-1) - i lies in
// s's document, for s in [s0, s1); du holds tokens from s0 on. Tokens in increasing order.
template <typename T>
void tile_dx(T* dx, const acc_t<T>* du, const acc_t<T>* wt, const int32_t* cu, int64_t docs,
             int64_t s0, int64_t s1, int64_t C, int64_t K) {
  using A = acc_t<T>;
  A acc[kLanes];
  for (int64_t s = s0; s < s1; s++) {
    const int64_t t_end = std::min(doc_end(cu, docs, s), s + K); // tokens [s, t_end) read s
    for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
      const int64_t n = std::min(kLanes, C - c0);
      for (int64_t c = 0; c < n; c++) acc[c] = A(0);
      for (int64_t t = s; t < t_end; t++) {
        const A* dur = du + (t - s0) * C + c0;
        const A* wr = wt + ((K - 1) - (t - s)) * C + c0;
        for (int64_t c = 0; c < n; c++) acc[c] += wr[c] * dur[c];
      }
      T* dxr = dx + s * C + c0;
      for (int64_t c = 0; c < n; c++) dxr[c] = from_acc<T>(acc[c]);
    }
  }
}

// part[i * C + c] += du[t, c] · x[t - (K-1) + i, c] for t in [t0, t1) and the taps inside t's
// document; du holds tokens from t0 on.
template <typename T>
void tile_dw(acc_t<T>* part, const acc_t<T>* du, const T* x, const int32_t* cu, int64_t docs,
             int64_t t0, int64_t t1, int64_t C, int64_t K) {
  using A = acc_t<T>;
  for (int64_t t = t0; t < t1; t++) {
    const A* dur = du + (t - t0) * C;
    for (int64_t i = first_tap(cu, docs, t, K); i < K; i++) {
      const T* xr = x + (t - (K - 1) + i) * C;
      A* pr = part + i * C;
      for (int64_t c = 0; c < C; c++) pr[c] += dur[c] * to_acc<A>(xr[c]);
    }
  }
}

} // namespace

template <typename T>
void causal_conv1d_fwd(T* y, const T* x, const T* w, const int32_t* cu_seqlens, int64_t docs,
                       int64_t tokens, int64_t channels, int64_t kernel_size, bool silu) {
  using A = acc_t<T>;
  const int64_t C = channels, K = kernel_size;
  const std::vector<A> wt = taps_by_channel(w, C, K);
#pragma omp parallel for schedule(static) if (tokens * C * K > kParallelMin)
  for (int64_t t = 0; t < tokens; t++) {
    A u[kLanes];
    const int64_t first = first_tap(cu_seqlens, docs, t, K);
    for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
      const int64_t n = std::min(kLanes, C - c0);
      pre_activation<T>(u, x, wt.data(), t, first, c0, n, C, K);
      T* yr = y + t * C + c0;
      if (silu)
        for (int64_t c = 0; c < n; c++) yr[c] = from_acc<T>(u[c] * sigmoid(u[c]));
      else
        for (int64_t c = 0; c < n; c++) yr[c] = from_acc<T>(u[c]);
    }
  }
}

template <typename T>
void causal_conv1d_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const int32_t* cu_seqlens,
                       int64_t docs, int64_t tokens, int64_t channels, int64_t kernel_size,
                       bool silu) {
  using A = acc_t<T>;
  const int64_t C = channels, K = kernel_size;
  if (dw && tokens == 0)
    for (int64_t j = 0; j < C * K; j++) dw[j] = from_acc<T>(A(0));
  if ((!dx && !dw) || tokens == 0) return;
  const std::vector<A> wt = taps_by_channel(w, C, K);
  // Fixed token blocks (a function of `tokens` only); block b adds its tokens' dw terms into its
  // own partial [K, C], and the partials are summed in block order below.
  const int64_t block = std::max(kTile, (tokens + kMaxTokenBlocks - 1) / kMaxTokenBlocks);
  const int64_t n_blocks = (tokens + block - 1) / block;
  std::vector<A> partial(dw ? size_t(n_blocks * K * C) : 0, A(0));
#pragma omp parallel for schedule(static) if (tokens * C * K > kParallelMin)
  for (int64_t b = 0; b < n_blocks; b++) {
    std::vector<A> du(size_t((kTile + K - 1) * C));
    const int64_t b_end = std::min(tokens, (b + 1) * block);
    for (int64_t s0 = b * block; s0 < b_end; s0 += kTile) {
      const int64_t s1 = std::min(b_end, s0 + kTile);
      // dx of [s0, s1) reads du up to K - 1 tokens further (recomputed, not shared with the
      // next tile, so tiles stay independent).
      const int64_t t1 = dx ? std::min(tokens, s1 + K - 1) : s1;
      tile_du<T>(du.data(), dy, x, wt.data(), cu_seqlens, docs, s0, t1, C, K, silu);
      if (dx) tile_dx<T>(dx, du.data(), wt.data(), cu_seqlens, docs, s0, s1, C, K);
      if (dw) tile_dw<T>(partial.data() + b * K * C, du.data(), x, cu_seqlens, docs, s0, s1, C, K);
    }
  }
  if (!dw) return;
  std::vector<A> total(size_t(K * C), A(0));
  for (int64_t b = 0; b < n_blocks; b++)
    for (int64_t j = 0; j < K * C; j++) total[j] += partial[b * K * C + j];
  for (int64_t c = 0; c < C; c++)
    for (int64_t i = 0; i < K; i++) dw[c * K + i] = from_acc<T>(total[i * C + c]);
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void causal_conv1d_fwd<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t,     \
                                     int64_t, int64_t, bool);                                      \
  template void causal_conv1d_bwd<T>(T*, T*, const T*, const T*, const T*, const int32_t*,         \
                                     int64_t, int64_t, int64_t, int64_t, bool);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
VLM_INSTANTIATE(bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
