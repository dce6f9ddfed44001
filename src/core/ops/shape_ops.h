// Layout ops: copies, casts, device moves and views. Views (reshape of a contiguous tensor,
// transpose, permute, slice) share storage; their backward maps gradients back to the input.
#pragma once

#include <vector>

#include "src/core/tensor.h"

namespace vlm {

// A contiguous copy (any layout in).
Tensor copy(const Tensor& x);
// Converts the dtype; the gradient is cast back to x's dtype.
Tensor cast(const Tensor& x, DType dtype);
// Copies to another device on a current stream: host -> device on the destination's (from pinned
// memory it returns at once), device -> host on the source's, which it then synchronizes (and
// throws any deferred device error); device -> device ordered with both devices' streams.
Tensor to_device(const Tensor& x, Device device);
// New shape with the same number of elements; one dim may be -1. A view when x is contiguous.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
// Elements [start, end) of dim (a view). Negative start/end count from the end.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Broadcast view (stride 0) of x to shape; trailing-aligned as in PyTorch.
Tensor expand(const Tensor& x, const Shape& shape);

// In place, never recorded: dst (any layout) = src (same shape; dtype converted; from any device).
void copy_(Tensor& dst, const Tensor& src);

} // namespace vlm
