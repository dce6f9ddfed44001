// Softmax cross-entropy (and the chunk kernels of the fused LM head + cross-entropy) on the GPU,
// declared in kernels/loss.h. Forward: one 256-thread block per row (grid-stride over rows), each
// thread an online (max, sum-exp) over its columns, combined by a fixed tree, then one block
// reduces the rows to the loss on the device; backward (lce_chunk_bwd, for a chunk or the whole
// vocabulary): one block per row recomputing softmax from the saved logsumexp.
#include "kernels/loss.h"

#include <climits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device_error.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kLossThreads = 256;
constexpr int kWarps = kLossThreads / 32;

// One block of kReduceThreads over all rows: thread t takes rows t, t + kReduceThreads, ... in
// order (a double sum and a count), then a fixed tree combines the threads. The smallest bad row
// is found the same way and reported by thread 0.
constexpr int kReduceThreads = 512;

template <typename I>
__global__ void __launch_bounds__(kReduceThreads)
    ce_reduce_kernel(float* loss, int64_t* num_valid, double* scale_out, const float* row_loss,
                     const I* labels, int64_t rows, int64_t vocab, int64_t ignore_index, bool mean,
                     dev::ErrorReporter errors) {
  __shared__ double s_sum[kReduceThreads];
  __shared__ long long s_valid[kReduceThreads], s_bad[kReduceThreads];
  double sum = 0;
  long long valid = 0, bad = LLONG_MAX;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t l = int64_t(labels[r]);
    if (l == ignore_index) continue;
    if (l < 0 || l >= vocab) {
      if (bad == LLONG_MAX) bad = r; // this thread's rows only grow
      continue;
    }
    valid++;
    sum += double(row_loss[r]);
  }
  s_sum[threadIdx.x] = sum;
  s_valid[threadIdx.x] = valid;
  s_bad[threadIdx.x] = bad;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + w];
      s_valid[threadIdx.x] += s_valid[threadIdx.x + w];
      const long long b = s_bad[threadIdx.x + w];
      if (b < s_bad[threadIdx.x]) s_bad[threadIdx.x] = b;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const long long n = s_valid[0];
    // As the CPU op: scale = 1/num_valid in double, loss = float(total * scale).
    const double scale = mean ? (n > 0 ? 1.0 / double(n) : 0.0) : 1.0;
    *num_valid = int64_t(n);
    *scale_out = scale;
    *loss = float(s_sum[0] * scale);
    if (s_bad[0] != LLONG_MAX) errors.report(s_bad[0], int64_t(labels[s_bad[0]]), vocab);
  }
}

// (m, s) represents s * exp(m); m == -inf means "empty": then s is 0, or NaN when a NaN logit was
// seen before any finite one. Adding s2 (resp. s) in those cases keeps such a NaN, as the CPU's
// sum does (bitwise the same as dropping it otherwise: it is 0).
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) {
    s += s2;
    return;
  }
  if (m == -INFINITY) {
    m = m2;
    s += s2;
    return;
  }
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    s += s2 * expf(m2 - m);
  }
}

// The (max, sum of exp(x - max)) pair of the row x[0, n) over the block (every thread must
// call; thread 0 gets the result): a running pair per thread, merged over the warp, then over
// the warps by thread 0 in warp order. s_m, s_s: kWarps floats of shared memory each.
template <typename T>
__device__ void row_max_sumexp(const T* x, int64_t n, float* s_m, float* s_s, float& row_m,
                               float& row_s) {
  float m = -INFINITY, s = 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = ld(x + c);
    if (v == -INFINITY) continue;
    if (v > m) {
      // m == -inf: expf gives 0 and s stays 0, or NaN after a NaN logit (which propagates).
      s = s * expf(m - v) + 1.f;
      m = v;
    } else {
      s += expf(v - m); // NaN propagates
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  __syncthreads(); // the previous row's readers of s_m, s_s are done
  if ((threadIdx.x & 31) == 0) {
    s_m[threadIdx.x >> 5] = m;
    s_s[threadIdx.x >> 5] = s;
  }
  __syncthreads();
  row_m = s_m[0];
  row_s = s_s[0];
  if (threadIdx.x == 0)
    for (int w = 1; w < kWarps; w++) lse_merge(row_m, row_s, s_m[w], s_s[w]);
}

template <typename T, typename I>
__global__ void __launch_bounds__(kLossThreads)
    ce_fwd_kernel(float* row_loss, float* lse, const T* logits, const I* labels, int64_t rows,
                  int64_t vocab, int64_t ignore_index) {
  __shared__ float s_m[kWarps], s_s[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * vocab;
    float M, S;
    row_max_sumexp(x, vocab, s_m, s_s, M, S);
    if (threadIdx.x == 0) {
      // All -inf (or a +inf): the CPU returns the max itself.
      const float out = isinf(M) ? M : M + logf(S);
      lse[r] = out;
      const int64_t l = int64_t(labels[r]);
      // A bad label reads nothing: ce_reduce reports it and leaves the row out.
      row_loss[r] = l == ignore_index || l < 0 || l >= vocab ? 0.f : out - ld(x + l);
    }
  }
}

// One block per row: the chunk's (max, sum-exp) merged into the running pair.
template <typename T, typename I>
__global__ void __launch_bounds__(kLossThreads)
    lce_chunk_fwd_kernel(float* run_max, float* run_sum, float* target, const T* logits,
                         const I* labels, int64_t rows, int64_t chunk, int64_t v0,
                         int64_t ignore_index) {
  __shared__ float s_m[kWarps], s_s[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * chunk;
    float cm, cs;
    row_max_sumexp(x, chunk, s_m, s_s, cm, cs);
    if (threadIdx.x == 0) {
      // As the CPU: a chunk without a finite (or +inf) logit adds nothing.
      if (cm != -INFINITY) {
        float M = run_max[r], S = run_sum[r];
        lse_merge(M, S, cm, cs);
        run_max[r] = M;
        run_sum[r] = S;
      }
      const int64_t l = int64_t(labels[r]);
      if (l != ignore_index && l >= v0 && l < v0 + chunk) target[r] = ld(x + (l - v0));
    }
  }
}

template <typename I>
__global__ void lce_finish_kernel(float* row_loss, float* lse, const float* run_max,
                                  const float* run_sum, const float* target, const I* labels,
                                  int64_t rows, int64_t ignore_index) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const float m = run_max[r];
    const float out = isinf(m) ? m : m + logf(run_sum[r]);
    lse[r] = out;
    row_loss[r] = int64_t(labels[r]) == ignore_index ? 0.f : out - target[r];
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kLossThreads)
    lce_chunk_bwd_kernel(T* dlogits, const T* logits, const float* lse, const I* labels,
                         const float* grad_loss, const double* scale, int64_t rows, int64_t chunk,
                         int64_t v0, int64_t ignore_index) {
  const float g = float(double(grad_loss[0]) * scale[0]);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * chunk;
    T* dx = dlogits + r * chunk;
    const int64_t l = int64_t(labels[r]);
    if (l == ignore_index) {
      for (int64_t c = threadIdx.x; c < chunk; c += blockDim.x) st(dx + c, 0.f);
      continue;
    }
    const float m = lse[r];
    for (int64_t c = threadIdx.x; c < chunk; c += blockDim.x) {
      const float p = expf(ld(x + c) - m);
      st(dx + c, v0 + c == l ? (p - 1.f) * g : p * g);
    }
  }
}

__global__ void round_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

} // namespace

template <typename T, typename I>
void lce_chunk_fwd(float* run_max, float* run_sum, float* target, const T* logits, const I* labels,
                   int64_t rows, int64_t chunk, int64_t v0, int64_t ignore_index, void* stream) {
  if (rows == 0 || chunk == 0) return;
  lce_chunk_fwd_kernel<cuda_t<T>, I><<<grid_blocks(rows, 1), kLossThreads, 0, as_stream(stream)>>>(
      run_max, run_sum, target, dptr(logits), labels, rows, chunk, v0, ignore_index);
  check_last_launch("lce_chunk_fwd");
}

template <typename I>
void lce_finish(float* row_loss, float* lse, const float* run_max, const float* run_sum,
                const float* target, const I* labels, int64_t rows, int64_t ignore_index,
                void* stream) {
  if (rows == 0) return;
  lce_finish_kernel<I><<<grid_blocks(rows, kLossThreads), kLossThreads, 0, as_stream(stream)>>>(
      row_loss, lse, run_max, run_sum, target, labels, rows, ignore_index);
  check_last_launch("lce_finish");
}

template <typename T, typename I>
void lce_chunk_bwd(T* dlogits, const T* logits, const float* lse, const I* labels,
                   const float* grad_loss, const double* scale, int64_t rows, int64_t chunk,
                   int64_t v0, int64_t ignore_index, void* stream) {
  if (rows == 0 || chunk == 0) return;
  lce_chunk_bwd_kernel<cuda_t<T>, I><<<grid_blocks(rows, 1), kLossThreads, 0, as_stream(stream)>>>(
      dptr(dlogits), dptr(logits), lse, labels, grad_loss, scale, rows, chunk, v0, ignore_index);
  check_last_launch("lce_chunk_bwd");
}

void round_to_bf16(bf16* out, const float* in, int64_t n, void* stream) {
  if (n == 0) return;
  round_bf16_kernel<<<grid_blocks(n, kLossThreads), kLossThreads, 0, as_stream(stream)>>>(dptr(out),
                                                                                          in, n);
  check_last_launch("round_to_bf16");
}

template <typename I>
void ce_reduce(float* loss, int64_t* num_valid, double* scale, const float* row_loss,
               const I* labels, int64_t rows, int64_t vocab, int64_t ignore_index, bool mean,
               int32_t site, void* stream) {
  // Launched for rows == 0 too: the outputs are still written.
  ce_reduce_kernel<I><<<1, kReduceThreads, 0, as_stream(stream)>>>(
      loss, num_valid, scale, row_loss, labels, rows, vocab, ignore_index, mean,
      dev::error_reporter(site));
  check_last_launch("cross_entropy (reduce)");
}

template <typename T, typename I>
void cross_entropy_fwd(float* row_loss, float* lse, const T* logits, const I* labels, int64_t rows,
                       int64_t vocab, int64_t ignore_index, void* stream) {
  if (rows == 0) return;
  ce_fwd_kernel<cuda_t<T>, I><<<grid_blocks(rows, 1), kLossThreads, 0, as_stream(stream)>>>(
      row_loss, lse, dptr(logits), labels, rows, vocab, ignore_index);
  check_last_launch("cross_entropy_fwd");
}

#define VLM_INSTANTIATE(T, I)                                                                      \
  template void cross_entropy_fwd<T, I>(float*, float*, const T*, const I*, int64_t, int64_t,      \
                                        int64_t, void*);                                           \
  template void lce_chunk_fwd<T, I>(float*, float*, float*, const T*, const I*, int64_t, int64_t,  \
                                    int64_t, int64_t, void*);                                      \
  template void lce_chunk_bwd<T, I>(T*, const T*, const float*, const I*, const float*,            \
                                    const double*, int64_t, int64_t, int64_t, int64_t, void*);
VLM_INSTANTIATE(float, int32_t)
VLM_INSTANTIATE(float, int64_t)
VLM_INSTANTIATE(vlm::bf16, int32_t)
VLM_INSTANTIATE(vlm::bf16, int64_t)
#undef VLM_INSTANTIATE

template void lce_finish<int32_t>(float*, float*, const float*, const float*, const float*,
                                  const int32_t*, int64_t, int64_t, void*);
template void lce_finish<int64_t>(float*, float*, const float*, const float*, const float*,
                                  const int64_t*, int64_t, int64_t, void*);
template void ce_reduce<int32_t>(float*, int64_t*, double*, const float*, const int32_t*, int64_t,
                                 int64_t, int64_t, bool, int32_t, void*);
template void ce_reduce<int64_t>(float*, int64_t*, double*, const float*, const int64_t*, int64_t,
                                 int64_t, int64_t, bool, int32_t, void*);

} // namespace vlm::kernels::cuda
