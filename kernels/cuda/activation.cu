// Activations and softmax on CUDA (declared in kernels/activation.h). The formulas are those of
// kernels/cpu/activation.cpp, evaluated in fp32 with the precise device math functions (expf,
// erff, tanhf, logf, 1/sqrtf: no fast-math intrinsics).
#include "kernels/activation.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace dev;

constexpr float kSqrt1_2 = 0.70710678118654752440f;    // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f; // 1/sqrt(2*pi)
constexpr float kBeta = 0.79788456080286535588f;       // sqrt(2/pi)
constexpr float kKappa = 0.044715f;
constexpr float kSoftplusThreshold = 20.0f; // torch softplus (beta 1): x itself above it

// Stable for large |x|: exp never overflows.
__device__ __forceinline__ float sigmoid_of(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  float e = expf(x);
  return e / (1.0f + e);
}

template <UnaryOp OP> __device__ __forceinline__ float unary_value(float x) {
  if constexpr (OP == UnaryOp::sigmoid) return sigmoid_of(x);
  if constexpr (OP == UnaryOp::silu) return x * sigmoid_of(x);
  if constexpr (OP == UnaryOp::gelu_erf) return 0.5f * x * (1.0f + erff(x * kSqrt1_2));
  if constexpr (OP == UnaryOp::gelu_tanh)
    return 0.5f * x * (1.0f + tanhf(kBeta * (x + kKappa * x * x * x)));
  if constexpr (OP == UnaryOp::exp) return expf(x);
  if constexpr (OP == UnaryOp::log) return logf(x);
  if constexpr (OP == UnaryOp::rsqrt) return 1.0f / sqrtf(x);
  if constexpr (OP == UnaryOp::square) return x * x;
  if constexpr (OP == UnaryOp::softplus) return x > kSoftplusThreshold ? x : log1pf(expf(x));
}

template <UnaryOp OP> __device__ __forceinline__ float unary_derivative(float x) {
  if constexpr (OP == UnaryOp::sigmoid) {
    float s = sigmoid_of(x);
    return s * (1.0f - s);
  }
  if constexpr (OP == UnaryOp::silu) {
    float s = sigmoid_of(x);
    return s * (1.0f + x * (1.0f - s));
  }
  if constexpr (OP == UnaryOp::gelu_erf) {
    float cdf = 0.5f * (1.0f + erff(x * kSqrt1_2));
    float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return cdf + x * pdf;
  }
  if constexpr (OP == UnaryOp::gelu_tanh) {
    float x2 = x * x;
    float t = tanhf(kBeta * (x + kKappa * x2 * x));
    float dinner = kBeta * (1.0f + 3.0f * kKappa * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
  }
  if constexpr (OP == UnaryOp::exp) return expf(x);
  if constexpr (OP == UnaryOp::log) return 1.0f / x;
  if constexpr (OP == UnaryOp::rsqrt) {
    float r = 1.0f / sqrtf(x);
    return -0.5f * r * r * r;
  }
  if constexpr (OP == UnaryOp::square) return 2.0f * x;
  if constexpr (OP == UnaryOp::softplus) return x > kSoftplusThreshold ? 1.0f : sigmoid_of(x);
}

template <UnaryOp OP> struct UnaryFwd {
  __device__ void operator()(const float* x, float* y) const { y[0] = unary_value<OP>(x[0]); }
};
// x = {dy, x}
template <UnaryOp OP> struct UnaryBwd {
  __device__ void operator()(const float* x, float* y) const {
    y[0] = x[0] * unary_derivative<OP>(x[1]);
  }
};

// Calls f(std::integral_constant<UnaryOp, op>) so each kernel is compiled for one op.
template <typename F> void with_op(UnaryOp op, F&& f) {
  switch (op) {
  case UnaryOp::sigmoid: return f(std::integral_constant<UnaryOp, UnaryOp::sigmoid>());
  case UnaryOp::silu: return f(std::integral_constant<UnaryOp, UnaryOp::silu>());
  case UnaryOp::gelu_erf: return f(std::integral_constant<UnaryOp, UnaryOp::gelu_erf>());
  case UnaryOp::gelu_tanh: return f(std::integral_constant<UnaryOp, UnaryOp::gelu_tanh>());
  case UnaryOp::exp: return f(std::integral_constant<UnaryOp, UnaryOp::exp>());
  case UnaryOp::log: return f(std::integral_constant<UnaryOp, UnaryOp::log>());
  case UnaryOp::rsqrt: return f(std::integral_constant<UnaryOp, UnaryOp::rsqrt>());
  case UnaryOp::square: return f(std::integral_constant<UnaryOp, UnaryOp::square>());
  case UnaryOp::softplus: return f(std::integral_constant<UnaryOp, UnaryOp::softplus>());
  }
}

// x = {gate, up}
struct SwigluFwd {
  __device__ void operator()(const float* x, float* y) const {
    y[0] = x[0] * sigmoid_of(x[0]) * x[1];
  }
};
// x = {dy, gate, up}; y = {dgate, dup}
struct SwigluBwd {
  __device__ void operator()(const float* x, float* y) const {
    float d = x[0], g = x[1], s = sigmoid_of(g);
    y[0] = d * x[2] * s * (1.0f + g * (1.0f - s));
    y[1] = d * g * s;
  }
};

// --- softmax: one block per row (rows in grid.x, so any row count up to 2^31 - 1) -------------
template <typename T> __global__ void softmax_fwd_kernel(T* y, const T* x, int64_t cols) {
  __shared__ float scratch[32];
  const T* xr = x + int64_t(blockIdx.x) * cols;
  T* yr = y + int64_t(blockIdx.x) * cols;
  float mx = MaxOp::identity();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, to_f32(xr[c]));
  mx = block_reduce(mx, MaxOp{}, scratch);
  float total = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) total += expf(to_f32(xr[c]) - mx);
  total = block_reduce(total, SumOp{}, scratch);
  float inv = 1.0f / total;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    yr[c] = from_f32<T>(expf(to_f32(xr[c]) - mx) * inv);
}

template <typename T>
__global__ void softmax_bwd_kernel(T* dx, const T* dy, const T* y, int64_t cols) {
  __shared__ float scratch[32];
  const int64_t off = int64_t(blockIdx.x) * cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dot += to_f32(dy[off + c]) * to_f32(y[off + c]);
  dot = block_reduce(dot, SumOp{}, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dx[off + c] = from_f32<T>(to_f32(y[off + c]) * (to_f32(dy[off + c]) - dot));
}

int softmax_threads(int64_t cols) {
  return cols <= 128 ? 32 : cols <= 1024 ? 128 : cols <= 4096 ? 256 : 512;
}

void check_rows(const char* op, int64_t rows, int64_t cols) {
  VLM_CHECK(rows >= 0 && cols >= 0 && rows < (int64_t(1) << 31), op, ": ", rows,
            " rows do not fit one CUDA grid");
}

} // namespace

void unary_fwd(UnaryOp op, DType t, void* out, const void* x, int64_t n, void* stream) {
  with_op(op, [&](auto kOp) {
    launch_flat<1, 1>(unary_op_name(op), t, {out}, {x}, n, stream,
                      UnaryFwd<decltype(kOp)::value>{});
  });
}

void unary_bwd(UnaryOp op, DType t, void* dx, const void* dy, const void* x, int64_t n,
               void* stream) {
  with_op(op, [&](auto kOp) {
    launch_flat<2, 1>(unary_op_name(op), t, {dx}, {dy, x}, n, stream,
                      UnaryBwd<decltype(kOp)::value>{});
  });
}

void swiglu_fwd(DType t, void* out, const void* gate, const void* up, int64_t n, void* stream) {
  launch_flat<2, 1>("swiglu_fwd", t, {out}, {gate, up}, n, stream, SwigluFwd{});
}

void swiglu_bwd(DType t, void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                int64_t n, void* stream) {
  if (!dgate && !dup) return;
  launch_flat<3, 2>("swiglu_bwd", t, {dgate, dup}, {dy, gate, up}, n, stream, SwigluBwd{});
}

void softmax_fwd(DType t, void* y, const void* x, int64_t rows, int64_t cols, void* stream) {
  check_rows("softmax_fwd", rows, cols);
  if (rows == 0 || cols == 0) return;
  dispatch_float(t, "softmax_fwd", [&](auto tag) {
    using T = decltype(tag);
    softmax_fwd_kernel<T><<<unsigned(rows), softmax_threads(cols), 0, as_stream(stream)>>>(
        static_cast<T*>(y), static_cast<const T*>(x), cols);
    check_last_launch("softmax_fwd");
  });
}

void softmax_bwd(DType t, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                 void* stream) {
  check_rows("softmax_bwd", rows, cols);
  if (rows == 0 || cols == 0) return;
  dispatch_float(t, "softmax_bwd", [&](auto tag) {
    using T = decltype(tag);
    softmax_bwd_kernel<T><<<unsigned(rows), softmax_threads(cols), 0, as_stream(stream)>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), cols);
    check_last_launch("softmax_bwd");
  });
}

} // namespace vlm::kernels::cuda
