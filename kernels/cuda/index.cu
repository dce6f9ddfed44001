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
#include "kernels/cuda/load_store.cuh"
#include "kernels/cuda_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kThreads = 256;

template <typename I>
__global__ void __launch_bounds__(kThreads)
    out_of_range_kernel(unsigned long long* first, const I* index, int64_t n, int64_t limit) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(index[j]);
    if (v < 0 || v >= limit) atomicMin(first, (unsigned long long)j); // integer min: deterministic
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    select_kernel(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner) {
  const int64_t n = outer * n_index * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % inner, t = e / inner;
    const int64_t o = t / n_index, j = t % n_index;
    out[e] = x[(o * dim_size + int64_t(index[j])) * inner + i];
  }
}

template <typename K> __global__ void iota_kernel(K* v, int64_t n) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x)
    v[j] = K(j);
}

template <typename T, typename K>
__global__ void __launch_bounds__(kThreads)
    segment_add_kernel(T* out, const T* src, const K* rows_sorted, const K* pos_sorted,
                       int64_t outer, int64_t dim_size, int64_t n_index, int64_t inner) {
  const int64_t tasks = outer * n_index;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t o = task / n_index, k = task % n_index;
    const K row = rows_sorted[k];
    if (k > 0 && rows_sorted[k - 1] == row) continue; // not the first source of its row
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
int64_t first_out_of_range(const I* index, int64_t n, int64_t limit, void* stream) {
  if (n == 0) return -1;
  cudaStream_t s = as_stream(stream);
  auto* d_first = static_cast<unsigned long long*>(malloc_async(sizeof(unsigned long long), s));
  const unsigned long long none = ULLONG_MAX;
  VLM_CUDA_CHECK(cudaMemcpyAsync(d_first, &none, sizeof none, cudaMemcpyHostToDevice, s));
  out_of_range_kernel<I>
      <<<grid_blocks(n, kThreads, 4096), kThreads, 0, s>>>(d_first, index, n, limit);
  check_last_launch("first_out_of_range");
  unsigned long long first = 0;
  VLM_CUDA_CHECK(cudaMemcpyAsync(&first, d_first, sizeof first, cudaMemcpyDeviceToHost, s));
  free_async(d_first, s);
  VLM_CUDA_CHECK(cudaStreamSynchronize(s));
  return first == ULLONG_MAX ? -1 : int64_t(first);
}

template <typename T, typename I>
void index_select(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner, void* stream) {
  const int64_t n = outer * n_index * inner;
  if (n == 0) return;
  select_kernel<cuda_t<T>, I><<<grid_blocks(n, kThreads), kThreads, 0, as_stream(stream)>>>(
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
  iota_kernel<K><<<grid_blocks(n_index, kThreads, 4096), kThreads, 0, s>>>(pos_in, n_index);
  check_last_launch("index_add (iota)");
  size_t temp_bytes = 0;
  const int n = int(n_index), end_bit = key_bits(dim_size);
  VLM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in,
                                                 pos_out, n, 0, end_bit, s));
  void* temp = malloc_async(std::max<size_t>(temp_bytes, 1), s);
  VLM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in,
                                                 pos_out, n, 0, end_bit, s));
  check_last_launch("index_add (sort)");
  segment_add_kernel<cuda_t<T>, K><<<grid_blocks(outer * n_index, 1), kThreads, 0, s>>>(
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

template int64_t first_out_of_range<int32_t>(const int32_t*, int64_t, int64_t, void*);
template int64_t first_out_of_range<int64_t>(const int64_t*, int64_t, int64_t, void*);

} // namespace vlm::kernels::cuda
