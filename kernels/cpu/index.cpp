#include "kernels/index.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/instantiate.h"

namespace vlm::kernels::cpu {

namespace {
constexpr int64_t kParallelMin = 16384; // elements moved; below this one thread is faster
} // namespace

template <typename I> int64_t first_out_of_range(const I* index, int64_t n, int64_t limit) {
  for (int64_t j = 0; j < n; j++)
    if (int64_t(index[j]) < 0 || int64_t(index[j]) >= limit) return j;
  return -1;
}

template <typename T, typename I>
void index_select(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner) {
  const int64_t rows = outer * n_index;
#pragma omp parallel for if (rows * inner > kParallelMin && rows > 1)
  for (int64_t t = 0; t < rows; t++) {
    int64_t o = t / n_index, j = t % n_index;
    const T* from = x + (o * dim_size + int64_t(index[j])) * inner;
    std::copy(from, from + inner, out + t * inner);
  }
}

template <typename T, typename I>
void index_add(T* out, const T* src, const I* index, int64_t outer, int64_t dim_size,
               int64_t n_index, int64_t inner) {
  using A = acc_t<T>;
  if (outer == 0 || n_index == 0 || inner == 0) return;
  // Bucket the source positions by destination row (a stable counting sort, so each bucket lists
  // its sources in increasing j). Threads then own whole destination rows: no atomics, and the
  // summation order does not depend on the thread count.
  std::vector<int64_t> bucket_start(size_t(dim_size) + 1, 0);
  for (int64_t j = 0; j < n_index; j++) bucket_start[size_t(index[j]) + 1]++;
  for (int64_t r = 0; r < dim_size; r++) bucket_start[r + 1] += bucket_start[r];
  std::vector<int64_t> sources(static_cast<size_t>(n_index));
  std::vector<int64_t> next(bucket_start.begin(), bucket_start.end() - 1);
  for (int64_t j = 0; j < n_index; j++) sources[size_t(next[size_t(index[j])]++)] = j;
  std::vector<int64_t> hit_rows;
  for (int64_t r = 0; r < dim_size; r++)
    if (bucket_start[r + 1] > bucket_start[r]) hit_rows.push_back(r);

  const int64_t n_hit = int64_t(hit_rows.size()), tasks = outer * n_hit;
#pragma omp parallel if (outer * n_index * inner > kParallelMin && tasks > 1)
  {
    std::vector<A> acc(static_cast<size_t>(inner));
#pragma omp for
    for (int64_t t = 0; t < tasks; t++) {
      int64_t o = t / n_hit, r = hit_rows[size_t(t % n_hit)];
      T* dst = out + (o * dim_size + r) * inner;
      for (int64_t i = 0; i < inner; i++) acc[i] = to_acc<A>(dst[i]);
      for (int64_t k = bucket_start[r]; k < bucket_start[r + 1]; k++) {
        const T* s = src + (o * n_index + sources[k]) * inner;
        for (int64_t i = 0; i < inner; i++) acc[i] += to_acc<A>(s[i]);
      }
      for (int64_t i = 0; i < inner; i++) dst[i] = from_acc<T>(acc[i]);
    }
  }
}

#define VLM_INSTANTIATE(T, I)                                                                      \
  template void index_select<T, I>(T*, const T*, const I*, int64_t, int64_t, int64_t, int64_t);    \
  template void index_add<T, I>(T*, const T*, const I*, int64_t, int64_t, int64_t, int64_t);
VLM_FOR_EACH_VALUE_INDEX(VLM_INSTANTIATE)
#undef VLM_INSTANTIATE

template int64_t first_out_of_range<int32_t>(const int32_t*, int64_t, int64_t);
template int64_t first_out_of_range<int64_t>(const int64_t*, int64_t, int64_t);

} // namespace vlm::kernels::cpu
