// Shapes: int64 dims in PyTorch order, printed as (2, 16, 896).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t numel(const Shape& s);
// Row-major strides (in elements) for a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& s);
// Wraps a possibly negative dim into [0, ndim); error names the op.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

} // namespace vlm
