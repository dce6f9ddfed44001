// Device helpers shared by the elementwise, copy, activation and reduction kernels: storage types
// and fp32 conversions, 16-byte packs, grid sizing, fixed-order block reductions and the
// f32/bf16 dispatch of the launchers. For .cu files under kernels/cuda only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/gpu_runtime.h"
#include "src/base/dtype.h"

namespace vlm::kernels::cuda::dev {

// --- storage types ------------------------------------------------------------------------------
// vlm::bf16 and __nv_bfloat16 are both one 16-bit word: device code uses the CUDA type.
using bf16_t = __nv_bfloat16;

template <typename T> __device__ __forceinline__ float to_f32(T v) { return float(v); }
template <> __device__ __forceinline__ float to_f32<bf16_t>(bf16_t v) {
  return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T from_f32(float v) { return T(v); }
// Round to nearest even, as vlm::bf16 on the CPU.
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) {
  return __float2bfloat16_rn(v);
}

// N elements of T in one 16-byte (or smaller) aligned word, for vector loads and stores.
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };
template <typename T> constexpr int kPack = 16 / int(sizeof(T));

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// --- launch geometry ----------------------------------------------------------------------------
constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than this to fill an H200 (132 SMs x 2048 threads
// is 1056 blocks of 256); more only costs scheduling.
constexpr int64_t kMaxFlatBlocks = 8192;

inline unsigned flat_blocks(int64_t work_items) {
  int64_t b = (work_items + kThreads - 1) / kThreads;
  return unsigned(std::clamp<int64_t>(b, 1, kMaxFlatBlocks));
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// --- fixed-order reductions ---------------------------------------------------------------------
// Every reduction below combines values in an order fixed by the launch shape alone (a butterfly
// within the warp, then warp 0 over the warps' results), so results are bitwise reproducible.
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ static float identity() { return 0.0f; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ static float identity() { return -INFINITY; }
};

template <typename Op> __device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 floats; back-to-back calls may share it (each call starts with a
// barrier before writing it).
template <typename Op> __device__ float block_reduce(float v, Op op, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads(); // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : Op::identity();
  r = warp_reduce(r, op);
  return r;
}

// --- offsets of a linear index in a strided layout ----------------------------------------------
template <int MaxDims> struct Indexer {
  int ndim = 0;
  int64_t shape[MaxDims] = {};
  int64_t strides[MaxDims] = {};
  __device__ __forceinline__ int64_t offset(int64_t i) const {
    if (ndim == 1) return i * strides[0]; // the common collapsed case: no division
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
      int64_t s = shape[d];
      int64_t q = i / s;
      off += (i - q * s) * strides[d];
      i = q;
    }
    return off;
  }
  // The same with 32-bit division (several times cheaper than 64-bit on the GPU), for layouts
  // whose element count is below 2^32.
  __device__ __forceinline__ int64_t offset32(uint32_t i) const {
    if (ndim == 1) return int64_t(i) * strides[0];
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
      uint32_t s = uint32_t(shape[d]);
      uint32_t q = i / s;
      off += int64_t(i - q * s) * strides[d];
      i = q;
    }
    return off;
  }
};

// --- dtype dispatch -----------------------------------------------------------------------------
// Calls f(T{}) with T = float or bf16_t; any other dtype fails naming the op.
template <typename F> void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
  case DType::f32: return f(float{});
  case DType::bf16: return f(bf16_t{});
  default:
    VLM_FAIL(op, ": the CUDA kernels take f32 or bf16 tensors, got ", dtype_name(t),
             " (f64 runs on CPU only)");
  }
}

// --- flat elementwise maps ----------------------------------------------------------------------
// out_k[i] = f(in_0[i], ..., in_{NIN-1}[i])_k for n contiguous elements, computed in fp32. The
// functor is called as f(const float* x, float* y) with NIN inputs and NOUT outputs. A null
// output is skipped. Outputs may alias inputs element for element (each thread reads its elements
// before writing them).
template <int NIN, int NOUT, typename T> struct FlatArgs {
  const T* in[NIN];
  T* out[NOUT];
};

template <int NIN, int NOUT, typename T, int N, typename F>
__global__ void flat_kernel(FlatArgs<NIN, NOUT, T> args, int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / N;
  for (int64_t v = tid; v < nvec; v += stride) {
    Pack<T, N> pin[NIN], pout[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; k++) pin[k] = reinterpret_cast<const Pack<T, N>*>(args.in[k])[v];
#pragma unroll
    for (int j = 0; j < N; j++) {
      float x[NIN], y[NOUT];
#pragma unroll
      for (int k = 0; k < NIN; k++) x[k] = to_f32(pin[k].v[j]);
      f(x, y);
#pragma unroll
      for (int k = 0; k < NOUT; k++) pout[k].v[j] = from_f32<T>(y[k]);
    }
#pragma unroll
    for (int k = 0; k < NOUT; k++)
      if (args.out[k]) reinterpret_cast<Pack<T, N>*>(args.out[k])[v] = pout[k];
  }
  // The n % N elements after the last full pack.
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    float x[NIN], y[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; k++) x[k] = to_f32(args.in[k][i]);
    f(x, y);
#pragma unroll
    for (int k = 0; k < NOUT; k++)
      if (args.out[k]) args.out[k][i] = from_f32<T>(y[k]);
  }
}

// Launches flat_kernel for dtype t (f32 or bf16) on raw pointers; 16-byte packs when every
// pointer is 16-byte aligned.
template <int NIN, int NOUT, typename F>
void launch_flat(const char* op, DType t, void* const (&outs)[NOUT], const void* const (&ins)[NIN],
                 int64_t n, void* stream, F f) {
  if (n <= 0) return;
  dispatch_float(t, op, [&](auto tag) {
    using T = decltype(tag);
    FlatArgs<NIN, NOUT, T> args;
    bool aligned = true;
    for (int k = 0; k < NIN; k++) {
      args.in[k] = static_cast<const T*>(ins[k]);
      aligned = aligned && aligned16(ins[k]);
    }
    for (int k = 0; k < NOUT; k++) {
      args.out[k] = static_cast<T*>(outs[k]);
      aligned = aligned && (outs[k] == nullptr || aligned16(outs[k]));
    }
    constexpr int N = kPack<T>;
    if (aligned && n >= N)
      flat_kernel<NIN, NOUT, T, N>
          <<<flat_blocks(n / N), kThreads, 0, as_stream(stream)>>>(args, n, f);
    else
      flat_kernel<NIN, NOUT, T, 1><<<flat_blocks(n), kThreads, 0, as_stream(stream)>>>(args, n, f);
    check_last_launch(op);
  });
}

} // namespace vlm::kernels::cuda::dev
