#include "src/base/shape.h"

#include "src/base/check.h"

namespace vlm {

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); i++) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + ")";
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  VLM_CHECK(d >= 0 && d < ndim, op, ": dim ", dim, " out of range for a tensor with ", ndim,
            " dims");
  return d;
}

} // namespace vlm
