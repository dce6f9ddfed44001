// Gathers and deterministic scatter-adds on the GPU, declared in kernels/index.h.
//
// index_add groups the index positions by destination row with CUB's stable radix sort of the
// (row, position) pairs: a stable sort keeps the positions of one row in increasing order, so the
// result does not depend on scheduling, and a destination element then adds its sources in the
// same order as the CPU kernel (fp32 accumulator starting from the old value, rounded once): for
// f32 the two are bit-identical. Only integer data goes through the sort; no float atomics.
#include "kernels/index.h"

#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device_error.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kIndexThreads = 256;

// One block of kCheckThreads: each thread finds the smallest bad position among its indices, a
// fixed tree takes the minimum, and thread 0 reports it (with the value at that position).
constexpr int kCheckThreads = 1024;

template <typename I>
__global__ void __launch_bounds__(kCheckThreads)
    check_range_kernel(const I* index, int64_t n, int64_t limit, dev::ErrorReporter errors) {
  __shared__ long long s_bad[kCheckThreads];
  long long bad = LLONG_MAX;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t v = int64_t(index[j]);
    if (v < 0 || v >= limit) { // this thread's positions only grow
      bad = j;
      break;
    }
  }
  s_bad[threadIdx.x] = bad;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w && s_bad[threadIdx.x + w] < s_bad[threadIdx.x])
      s_bad[threadIdx.x] = s_bad[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0 && s_bad[0] != LLONG_MAX)
    errors.report(s_bad[0], int64_t(index[s_bad[0]]), limit);
}

template <typename T, typename I>
__global__ void __launch_bounds__(kIndexThreads)
    select_kernel(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner) {
  const int64_t n = outer * n_index * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % inner, t = e / inner;
    const int64_t o = t / n_index, j = t % n_index;
    const int64_t row = int64_t(index[j]);
    out[e] =
        row >= 0 && row < dim_size ? x[(o * dim_size + row) * inner + i] : dev::from_f32<T>(0.f);
  }
}

template <typename K> __global__ void iota_kernel(K* v, int64_t n) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x)
    v[j] = K(j);
}

template <typename T, typename K>
__global__ void __launch_bounds__(kIndexThreads)
    segment_add_kernel(T* out, const T* src, const K* rows_sorted, const K* pos_sorted,
                       int64_t outer, int64_t dim_size, int64_t n_index, int64_t inner) {
  const int64_t tasks = outer * n_index;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t o = task / n_index, k = task % n_index;
    const K row = rows_sorted[k];
    if (k > 0 && rows_sorted[k - 1] == row) continue;  // not the first source of its row
    if (uint64_t(row) >= uint64_t(dim_size)) continue; // a bad index (reported by the check)
    T* dst = out + (o * dim_size + int64_t(row)) * inner;
    for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
      float acc = ld(dst + i);
      for (int64_t kk = k; kk < n_index && rows_sorted[kk] == row; kk++)
        acc += ld(src + (o * n_index + int64_t(pos_sorted[kk])) * inner + i);
      st(dst + i, acc);
    }
  }
}

int key_bits(int64_t dim_size) {
  int bits = 1;
  while (bits < 63 && (int64_t(1) << bits) < dim_size) bits++;
  return bits;
}

} // namespace

template <typename I>
void check_index_range(const I* index, int64_t n, int64_t limit, int32_t site, void* stream) {
  if (n == 0) return;
  check_range_kernel<I>
      <<<1, kCheckThreads, 0, as_stream(stream)>>>(index, n, limit, dev::error_reporter(site));
  check_last_launch("check_index_range");
}

template <typename T, typename I>
void index_select(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner, void* stream) {
  const int64_t n = outer * n_index * inner;
  if (n == 0) return;
  select_kernel<cuda_t<T>, I>
      <<<grid_blocks(n, kIndexThreads), kIndexThreads, 0, as_stream(stream)>>>(
          dptr(out), dptr(x), index, outer, dim_size, n_index, inner);
  check_last_launch("index_select");
}

template <typename T, typename I>
void index_add(T* out, const T* src, const I* index, int64_t outer, int64_t dim_size,
               int64_t n_index, int64_t inner, void* stream) {
  if (outer == 0 || n_index == 0 || inner == 0) return;
  VLM_CHECK(n_index < int64_t(INT_MAX), "index_add (cuda): at most ", INT_MAX, " indices, got ",
            n_index);
  cudaStream_t s = as_stream(stream);
  // Indices are validated (in [0, dim_size)), so they sort as unsigned keys of the same width.
  using K = std::conditional_t<sizeof(I) == 4, uint32_t, uint64_t>;
  const K* keys_in = reinterpret_cast<const K*>(index);
  const size_t bytes = size_t(n_index) * sizeof(K);
  K* keys_out = static_cast<K*>(malloc_async(bytes, s));
  K* pos_in = static_cast<K*>(malloc_async(bytes, s));
  K* pos_out = static_cast<K*>(malloc_async(bytes, s));
  iota_kernel<K>
      <<<grid_blocks(n_index, kIndexThreads, 4096), kIndexThreads, 0, s>>>(pos_in, n_index);
  check_last_launch("index_add (iota)");
  size_t temp_bytes = 0;
  const int n = int(n_index), end_bit = key_bits(dim_size);
  VLM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in,
                                                 pos_out, n, 0, end_bit, s));
  void* temp = malloc_async(std::max<size_t>(temp_bytes, 1), s);
  VLM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in,
                                                 pos_out, n, 0, end_bit, s));
  check_last_launch("index_add (sort)");
  segment_add_kernel<cuda_t<T>, K><<<grid_blocks(outer * n_index, 1), kIndexThreads, 0, s>>>(
      dptr(out), dptr(src), keys_out, pos_out, outer, dim_size, n_index, inner);
  check_last_launch("index_add");
  free_async(temp, s);
  free_async(keys_out, s);
  free_async(pos_in, s);
  free_async(pos_out, s);
}

#define VLM_INSTANTIATE(T, I)                                                                      \
  template void index_select<T, I>(T*, const T*, const I*, int64_t, int64_t, int64_t, int64_t,     \
                                   void*);                                                         \
  template void index_add<T, I>(T*, const T*, const I*, int64_t, int64_t, int64_t, int64_t, void*);
VLM_INSTANTIATE(float, int32_t)
VLM_INSTANTIATE(float, int64_t)
VLM_INSTANTIATE(vlm::bf16, int32_t)
VLM_INSTANTIATE(vlm::bf16, int64_t)
#undef VLM_INSTANTIATE

template void check_index_range<int32_t>(const int32_t*, int64_t, int64_t, int32_t, void*);
template void check_index_range<int64_t>(const int64_t*, int64_t, int64_t, int32_t, void*);

} // namespace vlm::kernels::cuda
