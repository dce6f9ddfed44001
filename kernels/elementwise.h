// Elementwise arithmetic and reductions. Binary ops broadcast: the output is contiguous with
// layout.shape; a and b are read through their own strides (0 on broadcast dims).
#pragma once

#include <cstdint>

#include "kernels/copy.h"
#include "src/base/dtype.h"

namespace vlm::kernels {

enum class BinaryOp : uint8_t { add, sub, mul, div };

struct BroadcastLayout {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride_a[kMaxDims] = {};
  int64_t stride_b[kMaxDims] = {};
};

namespace cpu {

// out = a (op) b (=).
template <typename T>
void binary_fwd(BinaryOp op, T* out, const T* a, const T* b, const BroadcastLayout& layout);
// out = alpha * x + beta (=); x and out contiguous, may alias.
template <typename T> void affine_fwd(T* out, const T* x, double alpha, double beta, int64_t n);
// out += alpha * x (+=); both contiguous, same length.
template <typename T> void axpy(T* out, const T* x, double alpha, int64_t n);
// out[o] = sum of in over the reduced dims (=). `in` is described by a layout whose first
// `kept` dims are the output dims (row-major) and whose remaining dims are summed.
template <typename T> void sum_fwd(T* out, const T* in, const StridedLayout& in_layout, int kept);

} // namespace cpu

// CUDA versions (kernels/cuda/elementwise.cu, reduce.cu): f32 or bf16 (`t`), fp32 arithmetic,
// ordered on `stream` (a cudaStream_t; nullptr: legacy default stream), asynchronous unless
// stated. Same semantics as the cpu:: functions above.
namespace cuda {

void binary_fwd(BinaryOp op, DType t, void* out, const void* a, const void* b,
                const BroadcastLayout& layout, void* stream);
void affine_fwd(DType t, void* out, const void* x, double alpha, double beta, int64_t n,
                void* stream);
void axpy(DType t, void* out, const void* x, double alpha, int64_t n, void* stream);
// Deterministic: a fixed reduction tree that depends only on the shape (no atomics), so the same
// input gives bitwise the same sums on every run.
void sum_fwd(DType t, void* out, const void* in, const StridedLayout& in_layout, int kept,
             void* stream);
// The number of NaN and Inf values among n contiguous elements of floating type t (f32, bf16 or
// f64). Synchronous: waits for `stream`.
int64_t count_nonfinite(DType t, const void* x, int64_t n, void* stream);

} // namespace cuda
} // namespace vlm::kernels
