// Reductions: sums and means over dims (accumulated in f32, f64 for f64 tensors).
#pragma once

#include <vector>

#include "src/core/tensor.h"

namespace vlm {

// Sum over all elements: a 0-dim tensor.
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Sums x down to `shape` (the inverse of broadcasting); x itself when shapes match.
Tensor sum_to(const Tensor& x, const Shape& shape);

} // namespace vlm
