// Row gathers and scatter-adds along one dimension (index_select / index_add / embedding). A tensor
// is viewed as [outer, dim_size, inner] (contiguous) around the indexed dim; indices are int32 or
// int64, validated with first_out_of_range (CPU) or check_index_range (CUDA). Scatter-adds are
// deterministic: no atomics, every destination row sums its sources in increasing index position.
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

// Position of the first index outside [0, limit), or -1 when all n are in range.
template <typename I> int64_t first_out_of_range(const I* index, int64_t n, int64_t limit);

// out[o, j, :] = x[o, index[j], :] for j < n_index (=). x is [outer, dim_size, inner], out is
// [outer, n_index, inner].
template <typename T, typename I>
void index_select(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner);

// out[o, index[j], :] += src[o, j, :] for j < n_index (+=). out is [outer, dim_size, inner], src
// is [outer, n_index, inner]. Repeated indices sum in increasing j, in acc_t<T>, and each
// destination element is rounded to T once.
template <typename T, typename I>
void index_add(T* out, const T* src, const I* index, int64_t outer, int64_t dim_size,
               int64_t n_index, int64_t inner);

} // namespace vlm::kernels::cpu

// GPU versions (kernels/cuda/index.cu), T = float or bf16, I = int32_t or int64_t; pointers on the
// current device, asynchronous on `stream` (a cudaStream_t). Nothing here synchronizes.
namespace vlm::kernels::cuda {

// Checks that every index is in [0, limit) without a host synchronization: the first one outside
// (its position and value) goes to the device's deferred error record (kernels/gpu_runtime.h)
// under `site`. One block scans the n indices (they are token ids: a few thousand to a few
// hundred thousand), so "first" is the smallest position.
template <typename I>
void check_index_range(const I* index, int64_t n, int64_t limit, int32_t site, void* stream);

// As cpu::index_select; an index outside [0, dim_size) gives zeros (no out-of-bounds read; the
// check above reports it).
template <typename T, typename I>
void index_select(T* out, const T* x, const I* index, int64_t outer, int64_t dim_size,
                  int64_t n_index, int64_t inner, void* stream);

// Same contract as cpu::index_add, bit for bit the same summation order: the index positions are
// grouped by destination row with a stable (hence deterministic) CUB radix sort of (index, j),
// then one thread per destination element adds its sources in increasing j in fp32 and rounds
// once. No atomics on values; temporaries come from the stream-ordered pool. Indices outside
// [0, dim_size) are never written through (their rows are skipped; with such indices the other
// rows' sums are unspecified, as the failed check_index_range will be reported).
template <typename T, typename I>
void index_add(T* out, const T* src, const I* index, int64_t outer, int64_t dim_size,
               int64_t n_index, int64_t inner, void* stream);

} // namespace vlm::kernels::cuda
