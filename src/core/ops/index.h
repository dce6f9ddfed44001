// Gathers and scatter-adds along one dim: embedding lookup, index_select and index_add (used to
// put vision tokens into text positions). Index tensors are i32 or i64; an index out of range is an
// error naming its position and value. Backward passes are deterministic (no float atomics).
#pragma once

#include <cstdint>

#include "src/core/tensor.h"

namespace vlm {

// weight [V, H], ids of any shape -> [*ids.shape, H]. The weight gradient is a scatter-add of the
// output gradient rows into zeros [V, H]; repeated ids sum in order of position.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// As torch.index_select: index is 1-D; out.shape = x.shape with shape[dim] = index.size(0).
// Backward: index_add of the gradient into zeros shaped like x.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

// As torch.index_add (out-of-place): out = x, then out[..., index[i], ...] += src[..., i, ...]
// along dim. src.shape = x.shape with shape[dim] = index.size(0); repeated indices accumulate.
// Gradients: x gets the output gradient unchanged, src gets index_select(grad, dim, index).
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// The same op under the name used by the model code (index_add semantics, not torch.scatter_add).
inline Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return index_add(x, dim, index, src);
}

} // namespace vlm
