#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/fast_exp.h"
#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

namespace {

constexpr int64_t kParallelMin = 16384; // below this, threading costs more than it saves

// Stable for large |x| (exp never overflows) and vectorizable: fast_exp.h.
template <typename A> A sigmoid_of(A x) { return sigmoid(x); }

// Constants of the GELU forms (torch.nn.functional.gelu).
template <typename A> struct Gelu {
  static constexpr A kSqrt1_2 = A(0.70710678118654752440);    // 1/sqrt(2)
  static constexpr A kInvSqrt2Pi = A(0.39894228040143267794); // 1/sqrt(2*pi)
  static constexpr A kBeta = A(0.79788456080286535588);       // sqrt(2/pi)
  static constexpr A kKappa = A(0.044715);
};

// torch.nn.functional.softplus's threshold (beta 1): above it the result is x itself.
template <typename A> constexpr A kSoftplusThreshold = A(20);

template <typename A> A unary_value(UnaryOp op, A x) {
  using G = Gelu<A>;
  switch (op) {
  case UnaryOp::sigmoid: return sigmoid_of(x);
  case UnaryOp::silu: return x * sigmoid_of(x);
  case UnaryOp::gelu_erf: return A(0.5) * x * (A(1) + std::erf(x * G::kSqrt1_2));
  case UnaryOp::gelu_tanh:
    return A(0.5) * x * (A(1) + std::tanh(G::kBeta * (x + G::kKappa * x * x * x)));
  case UnaryOp::exp: return std::exp(x);
  case UnaryOp::log: return std::log(x);
  case UnaryOp::rsqrt: return A(1) / std::sqrt(x);
  case UnaryOp::square: return x * x;
  case UnaryOp::softplus: return x > kSoftplusThreshold<A> ? x : std::log1p(std::exp(x));
  }
  return x;
}

// d f(x) / dx.
template <typename A> A unary_derivative(UnaryOp op, A x) {
  using G = Gelu<A>;
  switch (op) {
  case UnaryOp::sigmoid: {
    A s = sigmoid_of(x);
    return s * (A(1) - s);
  }
  case UnaryOp::silu: {
    A s = sigmoid_of(x);
    return s * (A(1) + x * (A(1) - s));
  }
  case UnaryOp::gelu_erf: {
    A cdf = A(0.5) * (A(1) + std::erf(x * G::kSqrt1_2));
    A pdf = G::kInvSqrt2Pi * std::exp(A(-0.5) * x * x);
    return cdf + x * pdf;
  }
  case UnaryOp::gelu_tanh: {
    A x2 = x * x;
    A t = std::tanh(G::kBeta * (x + G::kKappa * x2 * x));
    A dinner = G::kBeta * (A(1) + A(3) * G::kKappa * x2);
    return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
  }
  case UnaryOp::exp: return std::exp(x);
  case UnaryOp::log: return A(1) / x;
  case UnaryOp::rsqrt: {
    A r = A(1) / std::sqrt(x);
    return A(-0.5) * r * r * r;
  }
  case UnaryOp::square: return A(2) * x;
  case UnaryOp::softplus: return x > kSoftplusThreshold<A> ? A(1) : sigmoid_of(x);
  }
  return A(0);
}

// Calls f(std::integral_constant<UnaryOp, op>) so each loop body is compiled for one op (the
// switches above fold away instead of running per element).
template <typename F> void with_op(UnaryOp op, F&& f) {
  using enum UnaryOp;
  switch (op) {
  case sigmoid: return f(std::integral_constant<UnaryOp, sigmoid>());
  case silu: return f(std::integral_constant<UnaryOp, silu>());
  case gelu_erf: return f(std::integral_constant<UnaryOp, gelu_erf>());
  case gelu_tanh: return f(std::integral_constant<UnaryOp, gelu_tanh>());
  case exp: return f(std::integral_constant<UnaryOp, exp>());
  case log: return f(std::integral_constant<UnaryOp, log>());
  case rsqrt: return f(std::integral_constant<UnaryOp, rsqrt>());
  case square: return f(std::integral_constant<UnaryOp, square>());
  case softplus: return f(std::integral_constant<UnaryOp, softplus>());
  }
}

} // namespace

template <typename T> void unary_fwd(UnaryOp op, T* out, const T* x, int64_t n) {
  using A = acc_t<T>;
  with_op(op, [&](auto kOp) {
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++) out[i] = from_acc<T>(unary_value<A>(kOp, to_acc<A>(x[i])));
  });
}

template <typename T> void unary_bwd(UnaryOp op, T* dx, const T* dy, const T* x, int64_t n) {
  using A = acc_t<T>;
  with_op(op, [&](auto kOp) {
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t i = 0; i < n; i++)
      dx[i] = from_acc<T>(to_acc<A>(dy[i]) * unary_derivative<A>(kOp, to_acc<A>(x[i])));
  });
}

template <typename T> void swiglu_fwd(T* out, const T* gate, const T* up, int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    A g = to_acc<A>(gate[i]);
    out[i] = from_acc<T>(g * sigmoid_of(g) * to_acc<A>(up[i]));
  }
}

template <typename T>
void swiglu_bwd(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    A g = to_acc<A>(gate[i]), d = to_acc<A>(dy[i]);
    A s = sigmoid_of(g);
    if (dgate) dgate[i] = from_acc<T>(d * to_acc<A>(up[i]) * s * (A(1) + g * (A(1) - s)));
    if (dup) dup[i] = from_acc<T>(d * g * s);
  }
}

template <typename T> void softmax_fwd(T* y, const T* x, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * cols > kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    A mx = -INFINITY;
    for (int64_t c = 0; c < cols; c++) mx = std::max(mx, to_acc<A>(xr[c]));
    A total = 0;
    for (int64_t c = 0; c < cols; c++) total += std::exp(to_acc<A>(xr[c]) - mx);
    A inv = A(1) / total;
    for (int64_t c = 0; c < cols; c++) yr[c] = from_acc<T>(std::exp(to_acc<A>(xr[c]) - mx) * inv);
  }
}

template <typename T> void softmax_bwd(T* dx, const T* dy, const T* y, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * cols > kParallelMin && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    const T* dyr = dy + r * cols;
    const T* yr = y + r * cols;
    T* dxr = dx + r * cols;
    A dot = 0;
    for (int64_t c = 0; c < cols; c++) dot += to_acc<A>(dyr[c]) * to_acc<A>(yr[c]);
    for (int64_t c = 0; c < cols; c++)
      dxr[c] = from_acc<T>(to_acc<A>(yr[c]) * (to_acc<A>(dyr[c]) - dot));
  }
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void unary_fwd<T>(UnaryOp, T*, const T*, int64_t);                                      \
  template void unary_bwd<T>(UnaryOp, T*, const T*, const T*, int64_t);                            \
  template void swiglu_fwd<T>(T*, const T*, const T*, int64_t);                                    \
  template void swiglu_bwd<T>(T*, T*, const T*, const T*, const T*, int64_t);                      \
  template void softmax_fwd<T>(T*, const T*, int64_t, int64_t);                                    \
  template void softmax_bwd<T>(T*, const T*, const T*, int64_t, int64_t);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
VLM_INSTANTIATE(bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
