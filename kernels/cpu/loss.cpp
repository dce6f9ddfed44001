#include "kernels/loss.h"

#include <algorithm>
#include <cmath>

namespace vlm::kernels::cpu {

namespace {

constexpr int64_t kParallelMin = 16384; // elements; below this one thread is faster

// Max-subtracted logsumexp of one row, in A.
template <typename A, typename T> A row_logsumexp(const T* x, int64_t n) {
  A mx = -INFINITY;
  for (int64_t c = 0; c < n; c++) mx = std::max(mx, to_acc<A>(x[c]));
  if (std::isinf(mx)) return mx; // all -inf (or a +inf): avoid inf - inf
  A total = 0;
  for (int64_t c = 0; c < n; c++) total += std::exp(to_acc<A>(x[c]) - mx);
  return mx + std::log(total);
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
void cross_entropy_bwd(T* dlogits, const T* logits, const acc_t<T>* lse, const I* labels,
                       const acc_t<T>* grad_loss, double scale, int64_t rows, int64_t vocab,
                       int64_t ignore_index) {
  using A = acc_t<T>;
  const A g = A(double(grad_loss[0]) * scale);
#pragma omp parallel for if (rows * vocab > kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const T* x = logits + r * vocab;
    T* dx = dlogits + r * vocab;
    int64_t l = int64_t(labels[r]);
    if (l == ignore_index) {
      std::fill(dx, dx + vocab, from_acc<T>(A(0)));
      continue;
    }
    A m = lse[r];
    for (int64_t c = 0; c < vocab; c++) dx[c] = from_acc<T>(std::exp(to_acc<A>(x[c]) - m) * g);
    dx[l] = from_acc<T>((std::exp(to_acc<A>(x[l]) - m) - A(1)) * g);
  }
}

#define VLM_INSTANTIATE(T, I)                                                                      \
  template void cross_entropy_fwd<T, I>(acc_t<T>*, acc_t<T>*, const T*, const I*, int64_t,         \
                                        int64_t, int64_t);                                         \
  template void cross_entropy_bwd<T, I>(T*, const T*, const acc_t<T>*, const I*, const acc_t<T>*,  \
                                        double, int64_t, int64_t, int64_t);
VLM_INSTANTIATE(float, int32_t)
VLM_INSTANTIATE(float, int64_t)
VLM_INSTANTIATE(double, int32_t)
VLM_INSTANTIATE(double, int64_t)
VLM_INSTANTIATE(bf16, int32_t)
VLM_INSTANTIATE(bf16, int64_t)
#undef VLM_INSTANTIATE

template int64_t check_labels<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t*);
template int64_t check_labels<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t*);

} // namespace vlm::kernels::cpu
