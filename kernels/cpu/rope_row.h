// RoPE on one head row with HF's T-roundings, shared by the RoPE kernel (kernels/cpu/rope.cpp)
// and the fused RMSNorm + RoPE (kernels/cpu/norm.cpp), so the two stay bit-identical.
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels::cpu::rope_row {

// The rotation (c, s) of every (j, j + half) pair of x into y, or its transpose when `inverse`;
// dims >= 2 * half are copied. Each product is rounded to T, as PyTorch rounds every elementwise
// op on a T tensor (identity for f32/f64).
template <typename T>
void rotate_row(T* y, const T* x, const T* c_row, const T* s_row, int64_t half, int64_t D,
                bool inverse) {
  using A = acc_t<T>;
  auto round = [](A v) { return to_acc<A>(from_acc<T>(v)); };
  for (int64_t j = 0; j < half; j++) {
    const A c = to_acc<A>(c_row[j]), s = to_acc<A>(s_row[j]);
    const A x1 = to_acc<A>(x[j]), x2 = to_acc<A>(x[j + half]);
    const A x1c = round(x1 * c), x2c = round(x2 * c);
    const A x1s = round(x1 * s), x2s = round(x2 * s);
    if (!inverse) {
      y[j] = from_acc<T>(x1c - x2s);
      y[j + half] = from_acc<T>(x2c + x1s);
    } else { // the transpose of the rotation matrix
      y[j] = from_acc<T>(x1c + x2s);
      y[j + half] = from_acc<T>(x2c - x1s);
    }
  }
  for (int64_t d = 2 * half; d < D; d++) y[d] = x[d];
}

} // namespace vlm::kernels::cpu::rope_row
