// What the state-store tests of boxes (slabs) share: values exact in bf16 and a box's values by
// index arithmetic, independent of the views the stores use.
#pragma once

#include <cstdint>
#include <vector>

#include "src/base/shape.h"

namespace vlm::testing {

// Quarters below 64 from `seed` on: exactly representable in bf16, distinct per element.
inline std::vector<double> pattern(const Shape& shape, double seed = 0) {
  std::vector<double> v(size_t(vlm::numel(shape)));
  for (size_t i = 0; i < v.size(); i++) v[i] = seed + 0.25 * double(i) - 3.0;
  return v;
}

// The row-major values of the box [offset, offset + box) of the row-major `all` of `shape`.
inline std::vector<double> box_values(const std::vector<double>& all, const Shape& shape,
                                      const std::vector<int64_t>& offset, const Shape& box) {
  std::vector<double> out;
  for (int64_t k = 0; k < vlm::numel(box); k++) {
    int64_t rest = k, flat = 0, stride = 1;
    for (size_t d = box.size(); d-- > 0;) {
      flat += (offset[d] + rest % box[d]) * stride;
      rest /= box[d];
      stride *= shape[d];
    }
    out.push_back(all[size_t(flat)]);
  }
  return out;
}

} // namespace vlm::testing
