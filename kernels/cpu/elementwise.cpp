#include "kernels/elementwise.h"

#include "src/base/check.h"
#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

namespace {

template <typename T, typename F>
void binary_loop(T* out, const T* a, const T* b, const BroadcastLayout& l, F f) {
  using A = acc_t<T>;
  int64_t n = 1;
  for (int d = 0; d < l.ndim; d++) n *= l.shape[d];
  if (n == 0) return;
  // Fast path: identical contiguous operands.
  bool flat = true;
  int64_t expect = 1;
  for (int d = l.ndim - 1; d >= 0; d--) {
    if (l.shape[d] != 1 && (l.stride_a[d] != expect || l.stride_b[d] != expect)) flat = false;
    expect *= l.shape[d];
  }
  if (flat) {
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; i++) out[i] = from_acc<T>(f(to_acc<A>(a[i]), to_acc<A>(b[i])));
    return;
  }
  int64_t idx[kMaxDims] = {};
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < n; i++) {
    out[i] = from_acc<T>(f(to_acc<A>(a[oa]), to_acc<A>(b[ob])));
    for (int d = l.ndim - 1; d >= 0; d--) {
      idx[d]++;
      oa += l.stride_a[d];
      ob += l.stride_b[d];
      if (idx[d] < l.shape[d]) break;
      oa -= l.stride_a[d] * l.shape[d];
      ob -= l.stride_b[d] * l.shape[d];
      idx[d] = 0;
    }
  }
}

} // namespace

template <typename T>
void binary_fwd(BinaryOp op, T* out, const T* a, const T* b, const BroadcastLayout& l) {
  using A = acc_t<T>;
  switch (op) {
  case BinaryOp::add: return binary_loop(out, a, b, l, [](A x, A y) { return x + y; });
  case BinaryOp::sub: return binary_loop(out, a, b, l, [](A x, A y) { return x - y; });
  case BinaryOp::mul: return binary_loop(out, a, b, l, [](A x, A y) { return x * y; });
  case BinaryOp::div: return binary_loop(out, a, b, l, [](A x, A y) { return x / y; });
  }
}

template <typename T> void affine_fwd(T* out, const T* x, double alpha, double beta, int64_t n) {
  using A = acc_t<T>;
  A al = A(alpha), be = A(beta);
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; i++) out[i] = from_acc<T>(al * to_acc<A>(x[i]) + be);
}

template <typename T> void axpy(T* out, const T* x, double alpha, int64_t n) {
  using A = acc_t<T>;
  A al = A(alpha);
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; i++) out[i] = from_acc<T>(to_acc<A>(out[i]) + al * to_acc<A>(x[i]));
}

template <typename T> void sum_fwd(T* out, const T* in, const StridedLayout& l, int kept) {
  using A = acc_t<T>;
  int64_t n_out = 1, n_red = 1;
  for (int d = 0; d < kept; d++) n_out *= l.shape[d];
  for (int d = kept; d < l.ndim; d++) n_red *= l.shape[d];
#pragma omp parallel for if (n_out * n_red > 65536 && n_out > 1)
  for (int64_t o = 0; o < n_out; o++) {
    // Offset of the kept coordinates.
    int64_t base = 0, rem = o;
    for (int d = kept - 1; d >= 0; d--) {
      base += (rem % l.shape[d]) * l.strides[d];
      rem /= l.shape[d];
    }
    A acc = 0;
    int64_t idx[kMaxDims] = {};
    int64_t off = base;
    for (int64_t r = 0; r < n_red; r++) {
      acc += to_acc<A>(in[off]);
      for (int d = l.ndim - 1; d >= kept; d--) {
        idx[d]++;
        off += l.strides[d];
        if (idx[d] < l.shape[d]) break;
        off -= l.strides[d] * l.shape[d];
        idx[d] = 0;
      }
    }
    out[o] = from_acc<T>(acc);
  }
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void binary_fwd<T>(BinaryOp, T*, const T*, const T*, const BroadcastLayout&);           \
  template void affine_fwd<T>(T*, const T*, double, double, int64_t);                              \
  template void axpy<T>(T*, const T*, double, int64_t);                                            \
  template void sum_fwd<T>(T*, const T*, const StridedLayout&, int);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
VLM_INSTANTIATE(bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
