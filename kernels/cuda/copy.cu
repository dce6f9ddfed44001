// Copies, casts and fills on CUDA (declared in kernels/copy.h).
#include "kernels/copy.h"

#include <cstring>

#include "kernels/cuda/launch.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace dev;

// Drops size-1 dims and merges neighbours that are contiguous with each other (a transpose of
// [B, S, H, D] that keeps D in place becomes 3 dims with a contiguous innermost one, etc.).
StridedLayout collapse(const StridedLayout& l) {
  StridedLayout c;
  for (int d = 0; d < l.ndim; d++) {
    if (l.shape[d] == 1) continue;
    int last = c.ndim - 1;
    if (last >= 0 && c.strides[last] == l.strides[d] * l.shape[d]) {
      c.shape[last] *= l.shape[d];
      c.strides[last] = l.strides[d];
    } else {
      c.shape[c.ndim] = l.shape[d];
      c.strides[c.ndim] = l.strides[d];
      c.ndim++;
    }
  }
  return c;
}

int64_t numel_of(const StridedLayout& l) {
  int64_t n = 1;
  for (int d = 0; d < l.ndim; d++) n *= l.shape[d];
  return n;
}

Indexer<kMaxDims> indexer_of(const StridedLayout& l) {
  Indexer<kMaxDims> ix;
  ix.ndim = l.ndim;
  for (int d = 0; d < l.ndim; d++) {
    ix.shape[d] = l.shape[d];
    ix.strides[d] = l.strides[d];
  }
  return ix;
}

// Elements as plain words of their size: copies move bits, whatever the dtype.
template <size_t S> struct Word;
template <> struct Word<1> { using type = uint8_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<8> { using type = uint64_t; };

// GATHER: out[i] = in[offset(i)]; otherwise out[offset(i)] = in[i].
// SMALL: n < 2^32, offsets found with 32-bit division.
template <typename W, bool GATHER, bool SMALL>
__global__ void strided_copy_kernel(W* out, const W* in, Indexer<kMaxDims> ix, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off = SMALL ? ix.offset32(uint32_t(i)) : ix.offset(i);
    if constexpr (GATHER)
      out[i] = in[off];
    else
      out[off] = in[i];
  }
}

template <bool GATHER>
void strided_copy(const char* op, void* out, const void* in, size_t elem_size,
                  const StridedLayout& layout, void* stream) {
  VLM_CHECK(layout.ndim >= 0 && layout.ndim <= kMaxDims, op, ": bad layout ndim ", layout.ndim);
  int64_t n = numel_of(layout);
  if (n == 0) return;
  StridedLayout c = collapse(layout);
  if (c.ndim == 0 || (c.ndim == 1 && c.strides[0] == 1)) {
    memcpy_d2d(out, in, size_t(n) * elem_size, stream);
    return;
  }
  auto ix = indexer_of(c);
  auto launch = [&](auto word) {
    using W = decltype(word);
    if (n < (int64_t(1) << 32))
      strided_copy_kernel<W, GATHER, true><<<flat_blocks(n), kThreads, 0, as_stream(stream)>>>(
          static_cast<W*>(out), static_cast<const W*>(in), ix, n);
    else
      strided_copy_kernel<W, GATHER, false><<<flat_blocks(n), kThreads, 0, as_stream(stream)>>>(
          static_cast<W*>(out), static_cast<const W*>(in), ix, n);
    check_last_launch(op);
  };
  switch (elem_size) {
  case 1: return launch(uint8_t{});
  case 2: return launch(uint16_t{});
  case 4: return launch(uint32_t{});
  case 8: return launch(uint64_t{});
  default: VLM_FAIL(op, ": element size ", elem_size, " not supported on CUDA");
  }
}

// --- casts: the conversions of cpu::cast (floating types through f32, integers truncate) -------
template <typename T>
constexpr bool is_narrow_float = std::is_same_v<T, float> || std::is_same_v<T, bf16_t>;

template <typename T> __device__ __forceinline__ double load_d(T v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return double(__bfloat162float(v));
  else
    return double(v);
}
template <typename T> __device__ __forceinline__ T store_d(double v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return __float2bfloat16_rn(float(v));
  else if constexpr (std::is_same_v<T, float>)
    return float(v);
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else
    return T(v);
}

template <typename Out, typename In> __device__ __forceinline__ Out convert(In x) {
  if constexpr (std::is_same_v<Out, In>)
    return x;
  else if constexpr (is_narrow_float<In> && is_narrow_float<Out>)
    return from_f32<Out>(to_f32(x)); // f32 <-> bf16 without a trip through f64
  else
    return store_d<Out>(load_d(x));
}

template <typename Out, typename In, int N>
__global__ void cast_kernel(Out* out, const In* in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / N;
  for (int64_t v = tid; v < nvec; v += stride) {
    Pack<In, N> pi = reinterpret_cast<const Pack<In, N>*>(in)[v];
    Pack<Out, N> po;
#pragma unroll
    for (int j = 0; j < N; j++) po.v[j] = convert<Out>(pi.v[j]);
    reinterpret_cast<Pack<Out, N>*>(out)[v] = po;
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) out[i] = convert<Out>(in[i]);
}

template <typename F> void dispatch_cast_type(DType t, F&& f) {
  switch (t) {
  case DType::f32: return f(float{});
  case DType::bf16: return f(bf16_t{});
  case DType::f64: return f(double{});
  case DType::i32: return f(int32_t{});
  case DType::i64: return f(int64_t{});
  default:
    VLM_FAIL("cast: CUDA casts take f32, bf16, f64, i32 or i64, got ", dtype_name(t),
             " (cast on CPU)");
  }
}

template <typename T> __global__ void fill_kernel(T* out, T value, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = value;
}

} // namespace

void copy_strided(void* out, const void* in, size_t elem_size, const StridedLayout& in_layout,
                  void* stream) {
  strided_copy<true>("copy_strided", out, in, elem_size, in_layout, stream);
}

void copy_into_strided(void* out, const StridedLayout& out_layout, const void* in, size_t elem_size,
                       void* stream) {
  strided_copy<false>("copy_into_strided", out, in, elem_size, out_layout, stream);
}

void cast(void* out, DType out_type, const void* in, DType in_type, int64_t n, void* stream) {
  if (n <= 0) return;
  if (out_type == in_type) {
    memcpy_d2d(out, in, size_t(n) * dtype_size(in_type), stream);
    return;
  }
  dispatch_cast_type(in_type, [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch_cast_type(out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      constexpr int N = 4;
      auto* o = static_cast<Out*>(out);
      auto* x = static_cast<const In*>(in);
      bool vec = reinterpret_cast<uintptr_t>(o) % sizeof(Pack<Out, N>) == 0 &&
                 reinterpret_cast<uintptr_t>(x) % sizeof(Pack<In, N>) == 0 && n >= N;
      if (vec)
        cast_kernel<Out, In, N><<<flat_blocks(n / N), kThreads, 0, as_stream(stream)>>>(o, x, n);
      else
        cast_kernel<Out, In, 1><<<flat_blocks(n), kThreads, 0, as_stream(stream)>>>(o, x, n);
      check_last_launch("cast");
    });
  });
}

void fill(void* out, DType t, double value, int64_t n, void* stream) {
  if (n <= 0) return;
  auto launch = [&](auto value_t) {
    using T = decltype(value_t);
    fill_kernel<T>
        <<<flat_blocks(n), kThreads, 0, as_stream(stream)>>>(static_cast<T*>(out), value_t, n);
    check_last_launch("fill");
  };
  switch (t) {
  case DType::f32: return launch(float(value));
  case DType::bf16: {
    // The host's rounding (vlm::bf16), bit for bit.
    uint16_t bits = bf16(float(value)).bits;
    return launch(uint16_t(bits));
  }
  case DType::f16: return launch(uint16_t(f16(float(value)).bits));
  case DType::f64: return launch(double(value));
  case DType::i32: return launch(int32_t(value));
  case DType::i64: return launch(int64_t(value));
  case DType::u8: return launch(uint8_t(value));
  case DType::boolean: return launch(bool(value != 0));
  default: VLM_FAIL("fill: dtype ", dtype_name(t), " not supported on CUDA");
  }
}

} // namespace vlm::kernels::cuda
