// Activations and softmax on contiguous buffers. Math runs in acc_t<T> (double for double, float
// otherwise); outputs are stored in T. Backward kernels recompute what they need from the forward
// input (or the softmax output), so nothing else has to be saved.
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels {

// gelu_erf is the exact erf form, gelu_tanh the tanh approximation (torch approximate="tanh").
// softplus is torch's (beta 1, threshold 20): log(1 + e^x), x itself for x > 20 (derivative 1
// there, sigmoid(x) below).
enum class UnaryOp : uint8_t {
  sigmoid,
  silu,
  gelu_erf,
  gelu_tanh,
  exp,
  log,
  rsqrt,
  square,
  softplus
};

// The op's name in messages ("sigmoid", "gelu(tanh)", ...).
inline const char* unary_op_name(UnaryOp op) {
  switch (op) {
  case UnaryOp::sigmoid: return "sigmoid";
  case UnaryOp::silu: return "silu";
  case UnaryOp::gelu_erf: return "gelu";
  case UnaryOp::gelu_tanh: return "gelu(tanh)";
  case UnaryOp::exp: return "exp";
  case UnaryOp::log: return "log";
  case UnaryOp::rsqrt: return "rsqrt";
  case UnaryOp::square: return "square";
  case UnaryOp::softplus: return "softplus";
  }
  return "unary";
}

namespace cpu {

// out[i] = f(x[i]) for n elements (=); out may alias x.
template <typename T> void unary_fwd(UnaryOp op, T* out, const T* x, int64_t n);
// dx[i] = f'(x[i]) * dy[i] (=).
template <typename T> void unary_bwd(UnaryOp op, T* dx, const T* dy, const T* x, int64_t n);

// out[i] = silu(gate[i]) * up[i] (=).
template <typename T> void swiglu_fwd(T* out, const T* gate, const T* up, int64_t n);
// dgate[i] = dy[i] * up[i] * silu'(gate[i]) and dup[i] = dy[i] * silu(gate[i]) (=); either output
// may be null to skip it.
template <typename T>
void swiglu_bwd(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n);

// y[r, :] = softmax(x[r, :]) over `cols` for each of `rows` rows (=), max-subtracted, sums in
// acc_t<T>.
template <typename T> void softmax_fwd(T* y, const T* x, int64_t rows, int64_t cols);
// dx[r, :] = y[r, :] * (dy[r, :] - <dy[r, :], y[r, :]>) (=), from the saved output y.
template <typename T> void softmax_bwd(T* dx, const T* dy, const T* y, int64_t rows, int64_t cols);

} // namespace cpu

// CUDA versions (kernels/cuda/activation.cu): f32 or bf16 (`t`), math in fp32, contiguous
// buffers, ordered on `stream` (a cudaStream_t; nullptr: legacy default stream), asynchronous.
// Same semantics as the cpu:: functions above; softmax sums use a fixed-order block reduction.
namespace cuda {

void unary_fwd(UnaryOp op, DType t, void* out, const void* x, int64_t n, void* stream);
void unary_bwd(UnaryOp op, DType t, void* dx, const void* dy, const void* x, int64_t n,
               void* stream);
void swiglu_fwd(DType t, void* out, const void* gate, const void* up, int64_t n, void* stream);
void swiglu_bwd(DType t, void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                int64_t n, void* stream);
void softmax_fwd(DType t, void* y, const void* x, int64_t rows, int64_t cols, void* stream);
void softmax_bwd(DType t, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                 void* stream);

} // namespace cuda
} // namespace vlm::kernels
