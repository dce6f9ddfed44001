#include "src/core/ops/reduce.h"

#include <algorithm>

#include "kernels/elementwise.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm {

using namespace ops_detail;

namespace {

struct SumBackward final : Node {
  Shape in_shape;
  Shape keep_shape; // the output shape with reduced dims kept as 1
  double factor = 1.0;
  const char* name() const override { return factor == 1.0 ? "SumBackward" : "MeanBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor gk = reshape(g[0], keep_shape);
    Tensor gx = expand(gk, in_shape).contiguous();
    return {factor == 1.0 ? gx : scale(gx, factor)};
  }
};

Tensor reduce_impl(const char* op, const Tensor& x, std::vector<int64_t> dims, bool keepdim,
                   bool is_mean) {
  check_float(op, "x", x);
  std::vector<bool> reduced(size_t(x.dim()), false);
  for (auto& d : dims) {
    d = wrap_dim(d, x.dim(), op);
    VLM_CHECK(!reduced[d], op, ": dim ", d, " repeated");
    reduced[d] = true;
  }
  // Kept dims first (in order), then reduced dims: the kernel sums the trailing part.
  auto l = strided_layout(x);
  kernels::StridedLayout perm;
  perm.ndim = l.ndim;
  Shape out_shape, keep_shape;
  int k = 0;
  int64_t count = 1;
  for (int d = 0; d < l.ndim; d++)
    if (!reduced[d]) {
      perm.shape[k] = l.shape[d];
      perm.strides[k++] = l.strides[d];
      out_shape.push_back(l.shape[d]);
      keep_shape.push_back(l.shape[d]);
    } else {
      if (keepdim) out_shape.push_back(1);
      keep_shape.push_back(1);
      count *= l.shape[d];
    }
  int kept = k;
  for (int d = 0; d < l.ndim; d++)
    if (reduced[d]) {
      perm.shape[k] = l.shape[d];
      perm.strides[k++] = l.strides[d];
    }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  dispatch(
      op, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::sum_fwd<T>(out.data<T>(), static_cast<const T*>(x.data_ptr()), perm, kept);
      },
      [&](auto, void* stream) {
        kernels::cuda::sum_fwd(x.dtype(), out.data_ptr(), x.data_ptr(), perm, kept, stream);
      });
  double factor = is_mean ? 1.0 / double(std::max<int64_t>(count, 1)) : 1.0;
  if (is_mean) {
    NoGradGuard no_grad;
    scale_(out, factor);
  }
  check_finite(op, out);
  if (needs_grad({&x})) {
    auto node = std::make_shared<SumBackward>();
    node->in_shape = x.shape();
    node->keep_shape = keep_shape;
    node->factor = factor;
    record(node, {&x}, {&out});
  }
  return out;
}

std::vector<int64_t> all_dims(const Tensor& x) {
  std::vector<int64_t> d(size_t(x.dim()));
  for (size_t i = 0; i < d.size(); i++) d[i] = int64_t(i);
  return d;
}

} // namespace

Tensor sum(const Tensor& x) { return reduce_impl("sum", x, all_dims(x), false, false); }
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_impl("sum", x, dims, keepdim, false);
}
Tensor mean(const Tensor& x) { return reduce_impl("mean", x, all_dims(x), false, true); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_impl("mean", x, dims, keepdim, true);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  VLM_CHECK(int64_t(shape.size()) <= x.dim(), "sum_to: cannot reduce ", x.desc(), " to ",
            shape_str(shape));
  int64_t lead = x.dim() - int64_t(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); d++) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && x.shape()[d] != 1) {
      dims.push_back(d);
    } else {
      VLM_CHECK(shape[d - lead] == x.shape()[d], "sum_to: cannot reduce ", x.desc(), " to ",
                shape_str(shape));
    }
  }
  Tensor s = sum(x, dims, true);
  return reshape(s, shape);
}

} // namespace vlm
