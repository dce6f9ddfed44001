// AdamW (single- and multi-tensor) and the sum of squares for gradient clipping on the GPU,
// declared in kernels/optim.h. AdamW is written with the _rn intrinsics so that nvcc contracts
// nothing into an FMA: every element gets exactly the CPU kernel's fp32 operations (IEEE division
// and square root).
#include "kernels/optim.h"

#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kThreads = 256;
constexpr int64_t kSquaresBlock = 16384; // elements per fp64 partial
constexpr int64_t kMultiChunk = 32768;   // elements per block task of the multi-tensor kernel

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
__global__ void __launch_bounds__(kThreads)
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
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(const MultiDesc* descs, int64_t count, int64_t tasks) {
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    squares_kernel(double* partials, const T* x, int64_t n, int64_t num_partials) {
  __shared__ double smem[kThreads];
  for (int64_t b = blockIdx.x; b < num_partials; b += gridDim.x) {
    const int64_t begin = b * kSquaresBlock;
    const int64_t end = begin + kSquaresBlock < n ? begin + kSquaresBlock : n;
    double s = 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const double v = double(ld(x + i));
      s += v * v;
    }
    const double total = block_sum(s, smem);
    if (threadIdx.x == 0) partials[b] = total;
    __syncthreads(); // smem is reused by the next partial
  }
}

__global__ void __launch_bounds__(1024)
    sum_doubles_kernel(double* out, const double* v, int64_t n) {
  __shared__ double smem[1024];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  const double total = block_sum(s, smem);
  if (threadIdx.x == 0) *out = total;
}

} // namespace

template <typename T, typename G, typename S>
void adamw_step(T* param, S* master, const G* grad, S* exp_avg, S* exp_avg_sq, int64_t n,
                const AdamWStepArgs& args, void* stream) {
  static_assert(sizeof(S) == 4, "the CUDA AdamW keeps fp32 state");
  if (n == 0) return;
  adamw_kernel<cuda_t<T>, cuda_t<G>><<<grid_blocks(n, kThreads), kThreads, 0, as_stream(stream)>>>(
      dptr(param), master, dptr(grad), exp_avg, exp_avg_sq, n, scalars(args));
  check_last_launch("adamw_step");
}

template <typename T, typename G>
void adamw_multi_step(const AdamWTensor* tensors, int64_t count, void* stream) {
  std::vector<MultiDesc> descs;
  descs.reserve(size_t(count));
  int64_t tasks = 0;
  for (int64_t k = 0; k < count; k++) {
    const AdamWTensor& t = tensors[k];
    if (t.n == 0) continue;
    VLM_CHECK((sizeof(T) == 2) == (t.master != nullptr),
              "adamw_multi_step: a master copy is needed exactly for bf16 parameters");
    descs.push_back(
        MultiDesc{t.param, t.master, t.grad, t.exp_avg, t.exp_avg_sq, t.n, tasks, scalars(t.args)});
    tasks += (t.n + kMultiChunk - 1) / kMultiChunk;
  }
  if (descs.empty()) return;
  cudaStream_t s = as_stream(stream);
  const size_t bytes = descs.size() * sizeof(MultiDesc);
  auto* d_descs = static_cast<MultiDesc*>(malloc_async(bytes, s));
  // From pageable memory: the call returns once `descs` has been staged, so it may go away.
  VLM_CUDA_CHECK(cudaMemcpyAsync(d_descs, descs.data(), bytes, cudaMemcpyHostToDevice, s));
  adamw_multi_kernel<cuda_t<T>, cuda_t<G>>
      <<<grid_blocks(tasks, 1), kThreads, 0, s>>>(d_descs, int64_t(descs.size()), tasks);
  check_last_launch("adamw_multi_step");
  free_async(d_descs, s);
}

int64_t sum_squares_num_partials(int64_t n) { return (n + kSquaresBlock - 1) / kSquaresBlock; }

template <typename T>
void sum_squares_partials(double* partials, const T* x, int64_t n, void* stream) {
  const int64_t np = sum_squares_num_partials(n);
  if (np == 0) return;
  squares_kernel<cuda_t<T>>
      <<<grid_blocks(np, 1), kThreads, 0, as_stream(stream)>>>(partials, dptr(x), n, np);
  check_last_launch("sum_squares");
}

void sum_doubles(double* out, const double* partials, int64_t n, void* stream) {
  sum_doubles_kernel<<<1, 1024, 0, as_stream(stream)>>>(out, partials, n);
  check_last_launch("sum_doubles");
}

template void adamw_step<float, float, float>(float*, float*, const float*, float*, float*, int64_t,
                                              const AdamWStepArgs&, void*);
template void adamw_step<vlm::bf16, vlm::bf16, float>(vlm::bf16*, float*, const vlm::bf16*, float*,
                                                      float*, int64_t, const AdamWStepArgs&, void*);
template void adamw_step<vlm::bf16, float, float>(vlm::bf16*, float*, const float*, float*, float*,
                                                  int64_t, const AdamWStepArgs&, void*);
template void adamw_multi_step<float, float>(const AdamWTensor*, int64_t, void*);
template void adamw_multi_step<vlm::bf16, vlm::bf16>(const AdamWTensor*, int64_t, void*);
template void adamw_multi_step<vlm::bf16, float>(const AdamWTensor*, int64_t, void*);
template void sum_squares_partials<float>(double*, const float*, int64_t, void*);
template void sum_squares_partials<vlm::bf16>(double*, const vlm::bf16*, int64_t, void*);

} // namespace vlm::kernels::cuda
