// Elementwise arithmetic and reductions. Binary ops broadcast: the output is contiguous with
// layout.shape; a and b are read through their own strides (0 on broadcast dims).
#pragma once

#include <cstdint>

#include "kernels/copy.h"

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
} // namespace vlm::kernels
