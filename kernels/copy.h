// Copies, casts and fills on raw memory. Strided inputs are described by shape + strides in
// elements (ndim <= kMaxDims); outputs are contiguous unless stated.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels {

constexpr int kMaxDims = 8;

struct StridedLayout {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

namespace cpu {

// out[i] = in[layout(i)] for every element, elements of elem_size bytes; out contiguous (=).
void copy_strided(void* out, const void* in, size_t elem_size, const StridedLayout& in_layout);
// out[layout(i)] = in[i]: scatter a contiguous buffer into a strided destination (=).
void copy_into_strided(void* out, const StridedLayout& out_layout, const void* in,
                       size_t elem_size);
// out[i] = convert(in[i]) for n contiguous elements (=). Float->int truncates toward zero.
void cast(void* out, DType out_type, const void* in, DType in_type, int64_t n);
// out[i] = value for n elements of type t (=).
void fill(void* out, DType t, double value, int64_t n);

} // namespace cpu

// The same on the current CUDA device, ordered on `stream` (a cudaStream_t; nullptr: the legacy
// default stream), asynchronous. Element sizes 1, 2, 4 and 8 bytes; cast supports f32, bf16, f64,
// i32 and i64 with the CPU's conversions (floats through f32, like cpu::cast); fill every dtype,
// with the value converted on the host exactly as cpu::fill converts it.
namespace cuda {

void copy_strided(void* out, const void* in, size_t elem_size, const StridedLayout& in_layout,
                  void* stream);
void copy_into_strided(void* out, const StridedLayout& out_layout, const void* in, size_t elem_size,
                       void* stream);
void cast(void* out, DType out_type, const void* in, DType in_type, int64_t n, void* stream);
void fill(void* out, DType t, double value, int64_t n, void* stream);

} // namespace cuda
} // namespace vlm::kernels
