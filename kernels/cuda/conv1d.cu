// The causal depthwise conv1d on the GPU, declared in kernels/conv1d.h. Same sums in the same order
// as the CPU kernel (kernels/cpu/conv1d.cpp): taps in increasing order from zero, dx over the
// reading tokens in increasing order, dw over the CPU kernel's token blocks in block order.
//  * forward and dx: one thread per (token, channel), channels fastest (coalesced); the document
//    start of a token comes from a binary search in the offsets (on the device already).
//  * dw: a thread per (channel, token block) keeps the K sums of its channel in registers and
//    writes them to a scratch [blocks, K, C]; a second kernel adds the blocks in order.
#include "kernels/conv1d.h"

#include <algorithm>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kConvThreads = 256;
// The dw blocks of the CPU kernel: at most kMaxTokenBlocks blocks of at least kMinBlock tokens,
// a function of the token count only.
constexpr int64_t kMaxTokenBlocks = 128;
constexpr int64_t kMinBlock = 32;

// The document holding token t: the b with cu[b] <= t < cu[b + 1] (empty documents are skipped:
// the last b with cu[b] <= t). cu[0] = 0 <= t < cu[docs] = T.
__device__ __forceinline__ int doc_of(const int32_t* cu, int docs, int t) {
  int lo = 0, hi = docs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// 1 / (1 + exp(-u)) from exp(-|u|), as the CPU kernel (never overflows).
__device__ __forceinline__ float sigmoid(float u) {
  const float e = expf(-fabsf(u));
  const float s = 1.f / (1.f + e);
  return u >= 0.f ? s : e * s;
}

// The pre-activation of (t, c): Σ_{i >= first} w[c, i] · x[t - (K-1) + i, c], taps in order.
template <typename T>
__device__ __forceinline__ float pre_activation(const T* x, const T* w, int64_t t, int64_t c,
                                                int first, int C, int K) {
  float u = 0.f;
  for (int i = first; i < K; i++) u += ld(w + c * K + i) * ld(x + (t - (K - 1) + i) * C + c);
  return u;
}

// dL/du of (t, c): dy, times silu'(u) with u recomputed.
template <typename T>
__device__ __forceinline__ float grad_u(const T* dy, const T* x, const T* w, int64_t t, int64_t c,
                                        int first, int C, int K, bool silu) {
  const float d = ld(dy + t * C + c);
  if (!silu) return d;
  const float u = pre_activation(x, w, t, c, first, C, K);
  const float s = sigmoid(u);
  return d * s * (1.f + u * (1.f - s));
}

template <typename T>
__global__ void __launch_bounds__(kConvThreads)
    fwd_kernel(T* y, const T* x, const T* w, const int32_t* cu, int docs, int T_, int C, int K,
               bool silu) {
  const int64_t n = int64_t(T_) * C;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(e / C), c = int(e - int64_t(t) * C);
    const int start = cu[doc_of(cu, docs, t)];
    const int first = max(0, (K - 1) - (t - start));
    const float u = pre_activation(x, w, t, c, first, C, K);
    st(y + e, silu ? u * sigmoid(u) : u);
  }
}

// dx[s, c] = Σ_t w[c, K-1-(t-s)] · du[t, c] for t in [s, min(doc end, s + K)), increasing t.
template <typename T>
__global__ void __launch_bounds__(kConvThreads)
    dx_kernel(T* dx, const T* dy, const T* x, const T* w, const int32_t* cu, int docs, int T_,
              int C, int K, bool silu) {
  const int64_t n = int64_t(T_) * C;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int s = int(e / C), c = int(e - int64_t(s) * C);
    const int b = doc_of(cu, docs, s);
    const int start = cu[b], end = min(cu[b + 1], s + K);
    float acc = 0.f;
    for (int t = s; t < end; t++) {
      const int first = max(0, (K - 1) - (t - start));
      acc += ld(w + int64_t(c) * K + (K - 1) - (t - s)) * grad_u(dy, x, w, t, c, first, C, K, silu);
    }
    st(dx + e, acc);
  }
}

// partial[blk, i, c] = Σ_{t in block blk} du[t, c] · x[t - (K-1) + i, c] over the taps inside t's
// document, t increasing. Grid: (channel blocks, token blocks).
template <typename T>
__global__ void __launch_bounds__(kConvThreads)
    dw_partial_kernel(float* partial, const T* dy, const T* x, const T* w, const int32_t* cu,
                      int docs, int T_, int C, int K, int block, bool silu) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int t0 = blockIdx.y * block, t1 = min(T_, t0 + block);
  float acc[kMaxConvTaps];
#pragma unroll
  for (int i = 0; i < kMaxConvTaps; i++) acc[i] = 0.f;
  int b = t0 < T_ ? doc_of(cu, docs, t0) : 0;
  for (int t = t0; t < t1; t++) {
    while (cu[b + 1] <= t) b++; // next non-empty document
    const int first = max(0, (K - 1) - (t - cu[b]));
    const float du = grad_u(dy, x, w, t, c, first, C, K, silu);
#pragma unroll
    for (int i = 0; i < kMaxConvTaps; i++)
      if (i >= first && i < K) acc[i] += du * ld(x + int64_t(t - (K - 1) + i) * C + c);
  }
  float* out = partial + int64_t(blockIdx.y) * K * C;
#pragma unroll
  for (int i = 0; i < kMaxConvTaps; i++)
    if (i < K) out[int64_t(i) * C + c] = acc[i];
}

// dw[c, i] = Σ_blk partial[blk, i, c] in block order (zero for no blocks).
template <typename T>
__global__ void __launch_bounds__(kConvThreads)
    dw_sum_kernel(T* dw, const float* partial, int blocks, int C, int K) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x; // j = i * C + c
  if (j >= C * K) return;
  const int i = j / C, c = j - i * C;
  float total = 0.f;
  for (int blk = 0; blk < blocks; blk++) total += partial[int64_t(blk) * K * C + j];
  st(dw + int64_t(c) * K + i, total);
}

void check_shape(const char* op, const VarlenOffsets& offsets, int64_t tokens, int64_t C,
                 int64_t K) {
  const int64_t docs = offsets.docs;
  VLM_CHECK(docs >= 1 && tokens >= 0 && C > 0 && K >= 1, op, ": bad shape docs=", docs,
            " T=", tokens, " C=", C, " K=", K);
  VLM_CHECK(offsets.cu_seqlens != nullptr || tokens == 0, op, ": no device offsets");
  VLM_CHECK(K <= kMaxConvTaps, op, ": kernel_size ", K, " > ", kMaxConvTaps,
            " is not supported on CUDA");
  VLM_CHECK(tokens * C <= INT32_MAX && docs <= INT32_MAX, op, ": T=", tokens, " x C=", C,
            " exceeds 32-bit indices");
}

unsigned grid_for(int64_t n) {
  return unsigned(std::clamp<int64_t>((n + kConvThreads - 1) / kConvThreads, 1, 65536));
}

} // namespace

template <typename T>
void causal_conv1d_fwd(T* y, const T* x, const T* w, const VarlenOffsets& offsets, int64_t tokens,
                       int64_t channels, int64_t kernel_size, bool silu, void* stream) {
  check_shape("causal_conv1d_fwd", offsets, tokens, channels, kernel_size);
  if (tokens == 0) return;
  cudaStream_t st = as_stream(stream);
  fwd_kernel<<<grid_for(tokens * channels), kConvThreads, 0, st>>>(
      dptr(y), dptr(x), dptr(w), offsets.cu_seqlens, int(offsets.docs), int(tokens), int(channels),
      int(kernel_size), silu);
  check_last_launch("causal_conv1d_fwd");
}

template <typename T>
void causal_conv1d_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w,
                       const VarlenOffsets& offsets, int64_t tokens, int64_t channels,
                       int64_t kernel_size, bool silu, void* stream) {
  check_shape("causal_conv1d_bwd", offsets, tokens, channels, kernel_size);
  const int32_t* cu = offsets.cu_seqlens;
  const int docs = int(offsets.docs);
  const int C = int(channels), K = int(kernel_size);
  cudaStream_t st = as_stream(stream);
  if (dw && tokens == 0) memset_async(dw, 0, size_t(C) * K * sizeof(T), st); // bf16 zero: 0 bits
  if ((!dx && !dw) || tokens == 0) return;
  if (dx) {
    dx_kernel<<<grid_for(tokens * channels), kConvThreads, 0, st>>>(
        dptr(dx), dptr(dy), dptr(x), dptr(w), cu, docs, int(tokens), C, K, silu);
    check_last_launch("causal_conv1d_bwd (dx)");
  }
  if (dw) {
    const int64_t block = std::max(kMinBlock, (tokens + kMaxTokenBlocks - 1) / kMaxTokenBlocks);
    const int blocks = int((tokens + block - 1) / block);
    float* partial = static_cast<float*>(malloc_async(size_t(blocks) * K * C * sizeof(float), st));
    const dim3 grid(unsigned((C + kConvThreads - 1) / kConvThreads), unsigned(blocks));
    dw_partial_kernel<<<grid, kConvThreads, 0, st>>>(partial, dptr(dy), dptr(x), dptr(w), cu, docs,
                                                     int(tokens), C, K, int(block), silu);
    check_last_launch("causal_conv1d_bwd (dw blocks)");
    dw_sum_kernel<<<grid_for(int64_t(C) * K), kConvThreads, 0, st>>>(dptr(dw), partial, blocks, C,
                                                                     K);
    check_last_launch("causal_conv1d_bwd (dw sum)");
    free_async(partial, st);
  }
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void causal_conv1d_fwd<T>(T*, const T*, const T*, const VarlenOffsets&, int64_t,        \
                                     int64_t, int64_t, bool, void*);                               \
  template void causal_conv1d_bwd<T>(T*, T*, const T*, const T*, const T*, const VarlenOffsets&,   \
                                     int64_t, int64_t, int64_t, bool, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
