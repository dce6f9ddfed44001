// Elementwise arithmetic on CUDA (declared in kernels/elementwise.h): broadcasting binary ops,
// affine and axpy. fp32 arithmetic, bf16 or f32 storage.
#include "kernels/elementwise.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace dev;

template <BinaryOp OP> __device__ __forceinline__ float binary_value(float x, float y) {
  if constexpr (OP == BinaryOp::add) return x + y;
  if constexpr (OP == BinaryOp::sub) return x - y;
  if constexpr (OP == BinaryOp::mul) return x * y;
  if constexpr (OP == BinaryOp::div) return x / y;
}

template <BinaryOp OP> struct BinaryFlat {
  __device__ void operator()(const float* x, float* y) const {
    y[0] = binary_value<OP>(x[0], x[1]);
  }
};

// Drops size-1 dims and merges neighbours that are contiguous with each other in both operands,
// so the common cases (same shape, row or column broadcast) end up with 1 or 2 dims.
BroadcastLayout collapse(const BroadcastLayout& l) {
  BroadcastLayout c;
  for (int d = 0; d < l.ndim; d++) {
    if (l.shape[d] == 1) continue;
    int last = c.ndim - 1;
    if (last >= 0 && c.stride_a[last] == l.stride_a[d] * l.shape[d] &&
        c.stride_b[last] == l.stride_b[d] * l.shape[d]) {
      c.shape[last] *= l.shape[d];
      c.stride_a[last] = l.stride_a[d];
      c.stride_b[last] = l.stride_b[d];
    } else {
      c.shape[c.ndim] = l.shape[d];
      c.stride_a[c.ndim] = l.stride_a[d];
      c.stride_b[c.ndim] = l.stride_b[d];
      c.ndim++;
    }
  }
  return c;
}

// The general case: each output element finds its two input offsets by div/mod over the dims
// (in 32 bits when n < 2^32: I = uint32_t).
template <typename T, BinaryOp OP, typename I>
__global__ void broadcast_kernel(T* out, const T* a, const T* b, BroadcastLayout l, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I rem = I(i);
    int64_t oa = 0, ob = 0;
    for (int d = l.ndim - 1; d >= 0; d--) {
      I s = I(l.shape[d]);
      I q = rem / s;
      int64_t idx = int64_t(rem - q * s);
      oa += idx * l.stride_a[d];
      ob += idx * l.stride_b[d];
      rem = q;
    }
    out[i] = from_f32<T>(binary_value<OP>(to_f32(a[oa]), to_f32(b[ob])));
  }
}

// Row broadcast: `full` is [rows, cols] contiguous, `row` one row of cols: the bias and scale
// pattern. Blocks stride over rows, threads over columns: no index division. B_IS_ROW: the row
// is the right operand.
template <typename T, BinaryOp OP, bool B_IS_ROW>
__global__ void row_broadcast_kernel(T* out, const T* full, const T* row, int64_t rows,
                                     int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float f = to_f32(full[base + c]), v = to_f32(row[c]);
      out[base + c] = from_f32<T>(B_IS_ROW ? binary_value<OP>(f, v) : binary_value<OP>(v, f));
    }
  }
}

constexpr int64_t kRowKernelMinCols = 128; // narrower rows leave most threads of a block idle

constexpr const char* binary_name(BinaryOp op) {
  switch (op) {
  case BinaryOp::add: return "add";
  case BinaryOp::sub: return "sub";
  case BinaryOp::mul: return "mul";
  case BinaryOp::div: return "div";
  }
  return "binary";
}

template <BinaryOp OP>
void binary_launch(DType t, void* out, const void* a, const void* b, const BroadcastLayout& layout,
                   void* stream) {
  int64_t n = 1;
  for (int d = 0; d < layout.ndim; d++) n *= layout.shape[d];
  if (n == 0) return;
  BroadcastLayout c = collapse(layout);
  if (c.ndim == 0 || (c.ndim == 1 && c.stride_a[0] == 1 && c.stride_b[0] == 1)) {
    launch_flat<2, 1>(binary_name(OP), t, {out}, {a, b}, n, stream, BinaryFlat<OP>{});
    return;
  }
  dispatch_float(t, binary_name(OP), [&](auto tag) {
    using T = decltype(tag);
    auto* o = static_cast<T*>(out);
    auto* pa = static_cast<const T*>(a);
    auto* pb = static_cast<const T*>(b);
    cudaStream_t s = as_stream(stream);
    const bool wide = c.ndim == 2 && c.shape[1] >= kRowKernelMinCols;
    const unsigned row_blocks = unsigned(std::min<int64_t>(c.shape[0], kMaxFlatBlocks));
    if (wide && c.stride_a[0] == c.shape[1] && c.stride_a[1] == 1 && c.stride_b[0] == 0 &&
        c.stride_b[1] == 1) {
      row_broadcast_kernel<T, OP, true>
          <<<row_blocks, kThreads, 0, s>>>(o, pa, pb, c.shape[0], c.shape[1]);
    } else if (wide && c.stride_b[0] == c.shape[1] && c.stride_b[1] == 1 && c.stride_a[0] == 0 &&
               c.stride_a[1] == 1) {
      row_broadcast_kernel<T, OP, false>
          <<<row_blocks, kThreads, 0, s>>>(o, pb, pa, c.shape[0], c.shape[1]);
    } else if (n < (int64_t(1) << 32)) {
      broadcast_kernel<T, OP, uint32_t><<<flat_blocks(n), kThreads, 0, s>>>(o, pa, pb, c, n);
    } else {
      broadcast_kernel<T, OP, int64_t><<<flat_blocks(n), kThreads, 0, s>>>(o, pa, pb, c, n);
    }
    check_last_launch(binary_name(OP));
  });
}

struct AffineF {
  float alpha, beta;
  __device__ void operator()(const float* x, float* y) const { y[0] = alpha * x[0] + beta; }
};

struct AxpyF {
  float alpha;
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] + alpha * x[1]; }
};

} // namespace

void binary_fwd(BinaryOp op, DType t, void* out, const void* a, const void* b,
                const BroadcastLayout& layout, void* stream) {
  switch (op) {
  case BinaryOp::add: return binary_launch<BinaryOp::add>(t, out, a, b, layout, stream);
  case BinaryOp::sub: return binary_launch<BinaryOp::sub>(t, out, a, b, layout, stream);
  case BinaryOp::mul: return binary_launch<BinaryOp::mul>(t, out, a, b, layout, stream);
  case BinaryOp::div: return binary_launch<BinaryOp::div>(t, out, a, b, layout, stream);
  }
}

void affine_fwd(DType t, void* out, const void* x, double alpha, double beta, int64_t n,
                void* stream) {
  launch_flat<1, 1>("affine", t, {out}, {x}, n, stream, AffineF{float(alpha), float(beta)});
}

void axpy(DType t, void* out, const void* x, double alpha, int64_t n, void* stream) {
  launch_flat<2, 1>("axpy", t, {out}, {out, x}, n, stream, AxpyF{float(alpha)});
}

} // namespace vlm::kernels::cuda
