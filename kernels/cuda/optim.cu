// AdamW (single- and multi-tensor, the latter with a device-side skip flag), the multi-tensor sum
// of squares and scaling behind gradient clipping, and the step's non-finite guard on the GPU,
// declared in kernels/optim.h. AdamW is written with the _rn
// intrinsics so that nvcc contracts nothing into an FMA: every element gets exactly the CPU
// kernel's fp32 operations (IEEE division and square root).
#include "kernels/optim.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kOptimThreads = 256;
constexpr int64_t kMultiChunk = 32768; // elements per block task of the multi-tensor kernel

struct AdamWScalars {
  float decay, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps;
};

// Rounded to fp32 once on the host, exactly as the CPU kernel does.
AdamWScalars scalars(const AdamWStepArgs& args) {
  AdamWScalars a;
  a.decay = float(1.0 - args.lr * args.weight_decay);
  a.one_minus_beta1 = float(1.0 - args.beta1);
  a.beta2 = float(args.beta2);
  a.one_minus_beta2 = float(1.0 - args.beta2);
  a.neg_step_size = float(-args.step_size);
  a.bc2_sqrt = float(args.bias_correction2_sqrt);
  a.eps = float(args.eps);
  return a;
}

// One element, in the CPU kernel's operation order (torch's lerp, mul + addcmul, addcdiv).
template <typename T, typename G>
__device__ __forceinline__ void adamw_element(T* param, float* master, const G* grad,
                                              float* exp_avg, float* exp_avg_sq, int64_t i,
                                              const AdamWScalars& a) {
  const float g = ld(grad + i);
  float w = master ? master[i] : ld(param + i);
  w = __fmul_rn(w, a.decay);
  float m = exp_avg[i];
  m = __fadd_rn(m, __fmul_rn(a.one_minus_beta1, __fsub_rn(g, m)));
  float v = __fmul_rn(exp_avg_sq[i], a.beta2);
  v = __fadd_rn(v, __fmul_rn(__fmul_rn(a.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2_sqrt), a.eps);
  w = __fadd_rn(w, __fdiv_rn(__fmul_rn(a.neg_step_size, m), denom));
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  if (master) master[i] = w;
  st(param + i, w); // round-to-nearest-even for bf16
}

template <typename T, typename G>
__global__ void __launch_bounds__(kOptimThreads)
    adamw_kernel(T* param, float* master, const G* grad, float* exp_avg, float* exp_avg_sq,
                 int64_t n, AdamWScalars a) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    adamw_element(param, master, grad, exp_avg, exp_avg_sq, i, a);
}

struct MultiDesc {
  void* param;
  float* master;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  int64_t first_task; // prefix sum of the chunk counts of the tensors before this one
  AdamWScalars a;
};

template <typename T, typename G>
__global__ void __launch_bounds__(kOptimThreads)
    adamw_multi_kernel(const MultiDesc* descs, int64_t count, int64_t tasks, const double* skip) {
  if (skip && *skip != 0.0) return; // a non-finite step: nothing changes
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    int64_t lo = 0, hi = count - 1; // the last tensor whose first_task <= task
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (descs[mid].first_task <= task)
        lo = mid;
      else
        hi = mid - 1;
    }
    const MultiDesc& d = descs[lo];
    const int64_t begin = (task - d.first_task) * kMultiChunk;
    const int64_t end = begin + kMultiChunk < d.n ? begin + kMultiChunk : d.n;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      adamw_element(static_cast<T*>(d.param), d.master, static_cast<const G*>(d.grad), d.exp_avg,
                    d.exp_avg_sq, i, d.a);
  }
}

// Block-wide fp64 sum by a fixed tree; the result is valid in every thread after the call.
__device__ double block_sum(double v, double* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) smem[threadIdx.x] += smem[threadIdx.x + w];
    __syncthreads();
  }
  return smem[0];
}

// The descriptor table of one multi-tensor launch, passed by value in the kernel parameters
// (__grid_constant__: read from the constant bank, never copied per thread).
struct SpanTable {
  int64_t count;
  int64_t first_task[kGradSpansPerLaunch + 1]; // prefix sums of the chunk counts; [count] = tasks
  const void* data[kGradSpansPerLaunch];
  int64_t n[kGradSpansPerLaunch];
  uint8_t bf16[kGradSpansPerLaunch];
};
static_assert(sizeof(SpanTable) <= 32000, "kernel parameters are limited to 32764 bytes");

// The tensor of block task `task`: the last k with first_task[k] <= task (uniform per block).
__device__ __forceinline__ int64_t span_of(const SpanTable& t, int64_t task) {
  int64_t lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (t.first_task[mid] <= task)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Sum of x[i]^2 (fp64) over [begin, end) of one thread's share of a chunk: 16-byte loads when the
// tensor is 16-byte aligned (chunks start at multiples of kGradNormChunk, so every full pack of a
// chunk is aligned), the rest one element at a time. The order is a function of the launch shape.
template <typename T>
__device__ __forceinline__ double chunk_squares(const T* x, int64_t begin, int64_t end) {
  constexpr int N = 16 / int(sizeof(T));
  double s = 0;
  int64_t i = begin;
  if (is_aligned16(x)) {
    const int64_t packs = (end - begin) / N;
    const auto* p = reinterpret_cast<const Pack<T, N>*>(x + begin);
    for (int64_t v = threadIdx.x; v < packs; v += blockDim.x) {
      const Pack<T, N> pk = p[v];
#pragma unroll
      for (int k = 0; k < N; k++) {
        const double e = double(ld(&pk.v[k]));
        s += e * e;
      }
    }
    i = begin + packs * N;
  }
  for (i += threadIdx.x; i < end; i += blockDim.x) {
    const double e = double(ld(x + i));
    s += e * e;
  }
  return s;
}

__global__ void __launch_bounds__(kOptimThreads)
    multi_squares_kernel(const __grid_constant__ SpanTable t, double* partials) {
  __shared__ double smem[kOptimThreads];
  const int64_t tasks = t.first_task[t.count];
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t k = span_of(t, task);
    const int64_t begin = (task - t.first_task[k]) * kGradNormChunk;
    const int64_t end = begin + kGradNormChunk < t.n[k] ? begin + kGradNormChunk : t.n[k];
    const double s = t.bf16[k]
                         ? chunk_squares(static_cast<const __nv_bfloat16*>(t.data[k]), begin, end)
                         : chunk_squares(static_cast<const float*>(t.data[k]), begin, end);
    const double total = block_sum(s, smem);
    if (threadIdx.x == 0) partials[task] = total;
    __syncthreads(); // smem is reused by the next task
  }
}

// out[0] = the partials' sum (one block, fixed order), out[1] = the clip coefficient.
__global__ void __launch_bounds__(1024)
    finish_norm_kernel(double* out, const double* partials, int64_t n, double max_norm) {
  __shared__ double smem[1024];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  const double total = block_sum(s, smem);
  if (threadIdx.x == 0) {
    double coef = 1.0;
    if (max_norm > 0 && isfinite(total)) {
      // optim::clip_coefficient: min(1, max_norm / (sqrt(total) + 1e-6)), IEEE fp64 throughout.
      coef = __ddiv_rn(max_norm, __dadd_rn(__dsqrt_rn(total), 1e-6));
      if (!(coef < 1.0)) coef = 1.0;
    }
    out[0] = total;
    out[1] = coef;
  }
}

template <typename T>
__device__ __forceinline__ void chunk_scale(T* x, int64_t begin, int64_t end, float c) {
  constexpr int N = 16 / int(sizeof(T));
  int64_t i = begin;
  if (is_aligned16(x)) {
    const int64_t packs = (end - begin) / N;
    auto* p = reinterpret_cast<Pack<T, N>*>(x + begin);
    for (int64_t v = threadIdx.x; v < packs; v += blockDim.x) {
      Pack<T, N> pk = p[v];
#pragma unroll
      for (int k = 0; k < N; k++) st(&pk.v[k], __fmaf_rn(c, ld(&pk.v[k]), 0.0f));
      p[v] = pk;
    }
    i = begin + packs * N;
  }
  for (i += threadIdx.x; i < end; i += blockDim.x) st(x + i, __fmaf_rn(c, ld(x + i), 0.0f));
}

__global__ void __launch_bounds__(kOptimThreads)
    multi_scale_kernel(const __grid_constant__ SpanTable t, const double* coef_device,
                       double coef_host) {
  double coef = coef_host;
  if (coef_device) {
    coef = *coef_device;
    if (!(coef < 1.0)) return; // no clipping needed (or a NaN): leave the gradients alone
  }
  // scale_'s arithmetic on CUDA (kernels/cuda/elementwise.cu AffineF: alpha * x + 0, contracted).
  const float c = float(coef);
  const int64_t tasks = t.first_task[t.count];
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t k = span_of(t, task);
    const int64_t begin = (task - t.first_task[k]) * kGradNormChunk;
    const int64_t end = begin + kGradNormChunk < t.n[k] ? begin + kGradNormChunk : t.n[k];
    if (t.bf16[k])
      chunk_scale(static_cast<__nv_bfloat16*>(const_cast<void*>(t.data[k])), begin, end, c);
    else
      chunk_scale(static_cast<float*>(const_cast<void*>(t.data[k])), begin, end, c);
  }
}

// kernels::cpu::step_guard, by one thread: the same fp64 operations in the same order.
__global__ void step_guard_kernel(double* s, int64_t m, double max_norm) {
  double loss_sum = 0;
  for (int64_t i = 0; i < m; i++) loss_sum = __dadd_rn(loss_sum, s[i]);
  const double norm_sq = s[m];
  double coef = 1.0;
  if (max_norm > 0 && isfinite(norm_sq)) {
    coef = __ddiv_rn(max_norm, __dadd_rn(__dsqrt_rn(norm_sq), 1e-6));
    if (!(coef < 1.0)) coef = 1.0;
  }
  s[m + 1] = coef;
  s[m + 2] = isfinite(loss_sum) && isfinite(norm_sq) ? 0.0 : 1.0;
}

// Blocks of a multi-tensor launch: one per task up to what fills any GPU several times over; a
// block loops over the tasks after its own (the partial of a task does not depend on which block
// computed it).
constexpr int64_t kMaxMultiBlocks = 4096;

// Splits `tensors` (empty ones dropped) into tables of at most kGradSpansPerLaunch and calls
// launch(table, first partial of the table) for each, in order.
template <typename F> void for_each_table(const GradSpan* tensors, int64_t count, F&& launch) {
  SpanTable t;
  t.count = 0;
  t.first_task[0] = 0;
  int64_t base = 0;
  auto flush = [&] {
    if (t.count == 0) return;
    launch(t, base);
    base += t.first_task[t.count];
    t.count = 0;
  };
  for (int64_t k = 0; k < count; k++) {
    const GradSpan& g = tensors[k];
    if (g.n <= 0) continue;
    VLM_CHECK(g.data != nullptr, "multi-tensor gradient kernels: tensor ", k, " of ", count,
              " has ", g.n, " elements but no data");
    const int64_t i = t.count++;
    t.data[i] = g.data;
    t.n[i] = g.n;
    t.bf16[i] = g.bf16 ? 1 : 0;
    t.first_task[i + 1] = t.first_task[i] + (g.n + kGradNormChunk - 1) / kGradNormChunk;
    if (t.count == kGradSpansPerLaunch) flush();
  }
  flush();
}

unsigned multi_blocks(const SpanTable& t) {
  return unsigned(std::min<int64_t>(t.first_task[t.count], kMaxMultiBlocks));
}

} // namespace

template <typename T, typename G, typename S>
void adamw_step(T* param, S* master, const G* grad, S* exp_avg, S* exp_avg_sq, int64_t n,
                const AdamWStepArgs& args, void* stream) {
  static_assert(sizeof(S) == 4, "the CUDA AdamW keeps fp32 state");
  if (n == 0) return;
  adamw_kernel<cuda_t<T>, cuda_t<G>>
      <<<grid_blocks(n, kOptimThreads), kOptimThreads, 0, as_stream(stream)>>>(
          dptr(param), master, dptr(grad), exp_avg, exp_avg_sq, n, scalars(args));
  check_last_launch("adamw_step");
}

size_t adamw_multi_staging_bytes(int64_t count) { return size_t(count) * sizeof(MultiDesc); }

template <typename T, typename G>
void adamw_multi_step(const AdamWTensor* tensors, int64_t count, const double* skip, void* staging,
                      void* stream) {
  VLM_CHECK(staging != nullptr || count == 0, "adamw_multi_step: no staging buffer");
  auto* descs = static_cast<MultiDesc*>(staging);
  int64_t used = 0, tasks = 0;
  for (int64_t k = 0; k < count; k++) {
    const AdamWTensor& t = tensors[k];
    if (t.n == 0) continue;
    VLM_CHECK((sizeof(T) == 2) == (t.master != nullptr),
              "adamw_multi_step: a master copy is needed exactly for bf16 parameters");
    descs[used++] =
        MultiDesc{t.param, t.master, t.grad, t.exp_avg, t.exp_avg_sq, t.n, tasks, scalars(t.args)};
    tasks += (t.n + kMultiChunk - 1) / kMultiChunk;
  }
  if (used == 0) return;
  cudaStream_t s = as_stream(stream);
  const size_t bytes = size_t(used) * sizeof(MultiDesc);
  auto* d_descs = static_cast<MultiDesc*>(malloc_async(bytes, s));
  memcpy_h2d(d_descs, descs, bytes, s); // from pinned staging: asynchronous, counted
  adamw_multi_kernel<cuda_t<T>, cuda_t<G>>
      <<<grid_blocks(tasks, 1), kOptimThreads, 0, s>>>(d_descs, used, tasks, skip);
  check_last_launch("adamw_multi_step");
  free_async(d_descs, s);
}

int64_t multi_sum_squares_num_partials(const GradSpan* tensors, int64_t count) {
  int64_t total = 0;
  for (int64_t k = 0; k < count; k++)
    if (tensors[k].n > 0) total += (tensors[k].n + kGradNormChunk - 1) / kGradNormChunk;
  return total;
}

void multi_sum_squares(double* out, double* partials, const GradSpan* tensors, int64_t count,
                       double max_norm, void* stream) {
  cudaStream_t s = as_stream(stream);
  int64_t total = 0;
  for_each_table(tensors, count, [&](const SpanTable& t, int64_t base) {
    multi_squares_kernel<<<multi_blocks(t), kOptimThreads, 0, s>>>(t, partials + base);
    check_last_launch("grad_norm (multi-tensor sum of squares)");
    total = base + t.first_task[t.count];
  });
  // Also with no element at all: out = {0, 1}.
  finish_norm_kernel<<<1, 1024, 0, s>>>(out, partials, total, max_norm);
  check_last_launch("grad_norm (partials)");
}

void multi_scale(const GradSpan* tensors, int64_t count, const double* coef_device,
                 double coef_host, void* stream) {
  cudaStream_t s = as_stream(stream);
  for_each_table(tensors, count, [&](const SpanTable& t, int64_t) {
    multi_scale_kernel<<<multi_blocks(t), kOptimThreads, 0, s>>>(t, coef_device, coef_host);
    check_last_launch("clip (multi-tensor scale)");
  });
}

void step_guard(double* s, int64_t m, double max_norm, void* stream) {
  step_guard_kernel<<<1, 1, 0, as_stream(stream)>>>(s, m, max_norm);
  check_last_launch("step_guard (non-finite check and clip coefficient)");
}

template void adamw_step<float, float, float>(float*, float*, const float*, float*, float*, int64_t,
                                              const AdamWStepArgs&, void*);
template void adamw_step<vlm::bf16, vlm::bf16, float>(vlm::bf16*, float*, const vlm::bf16*, float*,
                                                      float*, int64_t, const AdamWStepArgs&, void*);
template void adamw_step<vlm::bf16, float, float>(vlm::bf16*, float*, const float*, float*, float*,
                                                  int64_t, const AdamWStepArgs&, void*);
template void adamw_multi_step<float, float>(const AdamWTensor*, int64_t, const double*, void*,
                                             void*);
template void adamw_multi_step<vlm::bf16, vlm::bf16>(const AdamWTensor*, int64_t, const double*,
                                                     void*, void*);
template void adamw_multi_step<vlm::bf16, float>(const AdamWTensor*, int64_t, const double*, void*,
                                                 void*);

} // namespace vlm::kernels::cuda
