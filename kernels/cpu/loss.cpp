#include "kernels/loss.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/instantiate.h"
#include "kernels/cpu/lane_reduce.h"

namespace vlm::kernels::cpu {

namespace {

constexpr int64_t kParallelMin = 16384; // elements; below this one thread is faster

// Max-subtracted logsumexp of one row, in A (vectorized: lane_reduce.h, fast_exp.h).
template <typename A, typename T> A row_logsumexp(const T* x, int64_t n) {
  const A mx = lane_max(
      n, [&](int64_t c) { return to_acc<A>(x[c]); }, A(-INFINITY));
  if (std::isinf(mx)) return mx; // all -inf (or a +inf): avoid inf - inf
  return mx +
         std::log(lane_sum<A>(n, [&](int64_t c) { return exp_nonpositive(to_acc<A>(x[c]) - mx); }));
}

// dx[c] = (softmax(x)[c] - [c == label]) * g for a row (or a vocabulary chunk of it) of n
// logits whose full-row logsumexp is m; `label` outside [0, n): no -1 term in this chunk.
template <typename A, typename T>
void softmax_grad_row(T* dx, const T* x, int64_t n, A m, A g, int64_t label) {
  for (int64_t c = 0; c < n; c++) dx[c] = from_acc<T>(exp_nonpositive(to_acc<A>(x[c]) - m) * g);
  if (label >= 0 && label < n)
    dx[label] = from_acc<T>((exp_nonpositive(to_acc<A>(x[label]) - m) - A(1)) * g);
}

} // namespace

template <typename I>
int64_t check_labels(const I* labels, int64_t rows, int64_t vocab, int64_t ignore_index,
                     int64_t* num_valid) {
  int64_t valid = 0, first_bad = -1;
  for (int64_t r = 0; r < rows; r++) {
    int64_t l = int64_t(labels[r]);
    if (l == ignore_index) continue;
    if (l < 0 || l >= vocab) {
      if (first_bad < 0) first_bad = r;
      continue;
    }
    valid++;
  }
  *num_valid = valid;
  return first_bad;
}

template <typename T, typename I>
void cross_entropy_fwd(acc_t<T>* row_loss, acc_t<T>* lse, const T* logits, const I* labels,
                       int64_t rows, int64_t vocab, int64_t ignore_index) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * vocab > kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const T* x = logits + r * vocab;
    A m = row_logsumexp<A>(x, vocab);
    lse[r] = m;
    int64_t l = int64_t(labels[r]);
    row_loss[r] = l == ignore_index ? A(0) : m - to_acc<A>(x[l]);
  }
}

template <typename T, typename I>
void lce_chunk_fwd(acc_t<T>* run_max, acc_t<T>* run_sum, acc_t<T>* target, const T* logits,
                   const I* labels, int64_t rows, int64_t chunk, int64_t v0, int64_t ignore_index) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * chunk > kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const T* x = logits + r * chunk;
    const int64_t l = int64_t(labels[r]);
    if (l != ignore_index && l >= v0 && l < v0 + chunk) target[r] = to_acc<A>(x[l - v0]);
    const A cm = lane_max(
        chunk, [&](int64_t c) { return to_acc<A>(x[c]); }, A(-INFINITY));
    if (cm == A(-INFINITY)) continue; // nothing to add
    const A cs =
        lane_sum<A>(chunk, [&](int64_t c) { return exp_nonpositive(to_acc<A>(x[c]) - cm); });
    A m = run_max[r];
    if (m == A(-INFINITY)) {
      run_max[r] = cm;
      run_sum[r] = cs;
    } else if (cm > m) {
      run_sum[r] = run_sum[r] * std::exp(m - cm) + cs;
      run_max[r] = cm;
    } else {
      run_sum[r] += cs * std::exp(cm - m);
    }
  }
}

template <typename A, typename I>
void lce_finish(A* row_loss, A* lse, const A* run_max, const A* run_sum, const A* target,
                const I* labels, int64_t rows, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; r++) {
    const A m = run_max[r];
    lse[r] = std::isinf(m) ? m : m + std::log(run_sum[r]);
    row_loss[r] = int64_t(labels[r]) == ignore_index ? A(0) : lse[r] - target[r];
  }
}

template <typename T, typename I>
void lce_chunk_bwd(T* dlogits, const T* logits, const acc_t<T>* lse, const I* labels,
                   const acc_t<T>* grad_loss, const double* scale, int64_t rows, int64_t chunk,
                   int64_t v0, int64_t ignore_index) {
  using A = acc_t<T>;
  const A g = A(double(grad_loss[0]) * scale[0]);
#pragma omp parallel for if (rows * chunk > kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const T* x = logits + r * chunk;
    T* dx = dlogits + r * chunk;
    const int64_t l = int64_t(labels[r]);
    if (l == ignore_index) {
      std::fill(dx, dx + chunk, from_acc<T>(A(0)));
      continue;
    }
    softmax_grad_row(dx, x, chunk, lse[r], g, l - v0);
  }
}

#define VLM_INSTANTIATE(T, I)                                                                      \
  template void cross_entropy_fwd<T, I>(acc_t<T>*, acc_t<T>*, const T*, const I*, int64_t,         \
                                        int64_t, int64_t);                                         \
  template void lce_chunk_fwd<T, I>(acc_t<T>*, acc_t<T>*, acc_t<T>*, const T*, const I*, int64_t,  \
                                    int64_t, int64_t, int64_t);                                    \
  template void lce_chunk_bwd<T, I>(T*, const T*, const acc_t<T>*, const I*, const acc_t<T>*,      \
                                    const double*, int64_t, int64_t, int64_t, int64_t);
VLM_FOR_EACH_VALUE_INDEX(VLM_INSTANTIATE)
#undef VLM_INSTANTIATE

template void lce_finish<float, int32_t>(float*, float*, const float*, const float*, const float*,
                                         const int32_t*, int64_t, int64_t);
template void lce_finish<float, int64_t>(float*, float*, const float*, const float*, const float*,
                                         const int64_t*, int64_t, int64_t);
template void lce_finish<double, int32_t>(double*, double*, const double*, const double*,
                                          const double*, const int32_t*, int64_t, int64_t);
template void lce_finish<double, int64_t>(double*, double*, const double*, const double*,
                                          const double*, const int64_t*, int64_t, int64_t);
template int64_t check_labels<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t*);
template int64_t check_labels<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t*);

} // namespace vlm::kernels::cpu
