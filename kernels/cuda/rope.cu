// RoPE on the GPU, declared in kernels/rope.h: one thread per table entry (rope_cos_sin) or per
// output element (rope_fwd / rope_bwd), grid-stride loops with 64-bit indices. Products use
// __fmul_rn so that no FMA contraction changes the rounding of the CPU formula.
#include "kernels/rope.h"

#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kRopeThreads = 256;

struct InvFreq {
  float v[kMaxRotaryDim / 2];
};

template <typename T, typename I>
__global__ void __launch_bounds__(kRopeThreads)
    cos_sin_kernel(T* cos, T* sin, const I* positions, int64_t tokens, int64_t half,
                   InvFreq inv_freq) {
  const int64_t n = tokens * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / half, k = i % half;
    const float angle = __fmul_rn(float(positions[t]), inv_freq.v[k]); // HF: position_ids.float()
    st(cos + i, cosf(angle));
    st(sin + i, sinf(angle));
  }
}

template <typename T, bool kInverse>
__global__ void __launch_bounds__(kRopeThreads)
    rotate_kernel(T* out, const T* in, const T* cos, const T* sin, int64_t tokens, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim) {
  const int64_t n = tokens * heads * head_dim, half = rotary_dim / 2;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % head_dim, row = i - d; // row: start of this (t, h) vector
    if (d >= rotary_dim) {
      out[i] = in[i];
      continue;
    }
    const int64_t t = (i / head_dim) / heads;
    const int64_t j = d < half ? d : d - half;
    const float c = ld(cos + t * half + j), s = ld(sin + t * half + j);
    const float x1 = ld(in + row + j), x2 = ld(in + row + j + half);
    const float x1c = round_to<T>(__fmul_rn(x1, c)), x2c = round_to<T>(__fmul_rn(x2, c));
    const float x1s = round_to<T>(__fmul_rn(x1, s)), x2s = round_to<T>(__fmul_rn(x2, s));
    float y;
    if (!kInverse)
      y = d < half ? __fsub_rn(x1c, x2s) : __fadd_rn(x2c, x1s);
    else // transpose of the rotation matrix
      y = d < half ? __fadd_rn(x1c, x2s) : __fsub_rn(x2c, x1s);
    st(out + i, y);
  }
}

template <typename T> void check_shape(const RopeShape& sh, const char* op) {
  VLM_CHECK(sh.rotary_dim >= 2 && sh.rotary_dim % 2 == 0 && sh.rotary_dim <= sh.head_dim, op,
            ": rotary_dim ", sh.rotary_dim, " must be even, >= 2 and <= head_dim ", sh.head_dim);
}

template <typename T, bool kInverse>
void rotate(T* out, const T* in, const T* cos, const T* sin, const RopeShape& sh, void* stream,
            const char* op) {
  check_shape<T>(sh, op);
  const int64_t n = sh.tokens * sh.heads * sh.head_dim;
  if (n == 0) return;
  rotate_kernel<cuda_t<T>, kInverse>
      <<<grid_blocks(n, kRopeThreads), kRopeThreads, 0, as_stream(stream)>>>(
          dptr(out), dptr(in), dptr(cos), dptr(sin), sh.tokens, sh.heads, sh.head_dim,
          sh.rotary_dim);
  check_last_launch(op);
}

} // namespace

template <typename T, typename I>
void rope_cos_sin(T* cos, T* sin, const I* positions, int64_t tokens, int64_t rotary_dim,
                  double theta, void* stream) {
  VLM_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= kMaxRotaryDim,
            "rope_cos_sin (cuda): rotary_dim must be even and in [2, ", kMaxRotaryDim, "], got ",
            rotary_dim);
  const int64_t half = rotary_dim / 2;
  // Exactly the CPU's fp32 computation (kernels/cpu/rope.cpp), done on the host.
  InvFreq inv_freq{};
  for (int64_t i = 0; i < half; i++)
    inv_freq.v[i] = 1.f / std::pow(float(theta), float(2 * i) / float(rotary_dim));
  const int64_t n = tokens * half;
  if (n == 0) return;
  cos_sin_kernel<cuda_t<T>, I>
      <<<grid_blocks(n, kRopeThreads), kRopeThreads, 0, as_stream(stream)>>>(
          dptr(cos), dptr(sin), positions, tokens, half, inv_freq);
  check_last_launch("rope_cos_sin");
}

template <typename T>
void rope_fwd(T* out, const T* x, const T* cos, const T* sin, const RopeShape& shape,
              void* stream) {
  rotate<T, false>(out, x, cos, sin, shape, stream, "rope_fwd");
}

template <typename T>
void rope_bwd(T* dx, const T* dy, const T* cos, const T* sin, const RopeShape& shape,
              void* stream) {
  rotate<T, true>(dx, dy, cos, sin, shape, stream, "rope_bwd");
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void rope_cos_sin<T, int32_t>(T*, T*, const int32_t*, int64_t, int64_t, double, void*); \
  template void rope_cos_sin<T, int64_t>(T*, T*, const int64_t*, int64_t, int64_t, double, void*); \
  template void rope_fwd<T>(T*, const T*, const T*, const T*, const RopeShape&, void*);            \
  template void rope_bwd<T>(T*, const T*, const T*, const T*, const RopeShape&, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
