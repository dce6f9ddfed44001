#include "src/core/ops/shape_ops.h"

#include <cstring>
#include <numeric>

#include "kernels/copy.h"
#include "kernels/gpu_runtime.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/reduce.h"
#include "src/core/stream.h"

namespace vlm {

using namespace ops_detail;

namespace {

struct IdentityBackward final : Node {
  const char* name() const override { return "CopyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {g[0]}; }
};

struct CastBackward final : Node {
  DType in_dtype;
  const char* name() const override { return "CastBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {cast(g[0], in_dtype)}; }
};

struct ToDeviceBackward final : Node {
  Device in_device;
  const char* name() const override { return "ToDeviceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    return {to_device(g[0], in_device)};
  }
};

struct ReshapeBackward final : Node {
  Shape in_shape;
  const char* name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {reshape(g[0], in_shape)}; }
};

struct PermuteBackward final : Node {
  std::vector<int64_t> inverse;
  const char* name() const override { return "PermuteBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    return {permute(g[0], inverse).contiguous()};
  }
};

struct SliceBackward final : Node {
  Shape in_shape;
  int64_t dim, start, end;
  const char* name() const override { return "SliceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor gx = Tensor::zeros(in_shape, g[0].dtype(), g[0].device());
    Tensor view = slice(gx, dim, start, end);
    copy_(view, g[0]);
    return {gx};
  }
};

struct ConcatBackward final : Node {
  int64_t dim;
  std::vector<int64_t> sizes;
  const char* name() const override { return "ConcatBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    std::vector<Tensor> out;
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); i++) {
      out.push_back(needs_input_grad(i) ? slice(g[0], dim, at, at + sizes[i]).contiguous()
                                        : Tensor());
      at += sizes[i];
    }
    return out;
  }
};

struct ExpandBackward final : Node {
  Shape in_shape;
  const char* name() const override { return "ExpandBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {sum_to(g[0], in_shape)}; }
};

// A view of x recorded with the given backward node.
template <typename NodeT>
Tensor make_view(const Tensor& x, Tensor view, std::shared_ptr<NodeT> node) {
  if (needs_grad({&x})) record(node, {&x}, {&view});
  return view;
}

// dst = src for contiguous tensors of the same shape and dtype on different devices, each copy on
// a current stream: host -> device on the destination's, device -> host on the source's (then
// that stream alone is synchronized, and its deferred device errors thrown), device -> device on
// the destination's, ordered after the source's work by an event and back again so the source's
// stream does not reuse the source's memory before the copy has read it.
void copy_between_devices(Tensor& dst, const Tensor& src) {
  const Device from = src.device(), to = dst.device();
  if (from.is_cpu()) {
    dispatch_device(
        "to_device", to, [] {},
        [&](auto stream) {
          kernels::cuda::memcpy_h2d(dst.data_ptr(), src.data_ptr(), src.nbytes(), stream);
        });
  } else if (to.is_cpu()) {
    dispatch_device(
        "to_device", from, [] {},
        [&](auto stream) {
          kernels::cuda::memcpy_d2h(dst.data_ptr(), src.data_ptr(), src.nbytes(), stream);
        });
    current_stream(from).synchronize();
  } else {
    const Stream src_stream = current_stream(from), dst_stream = current_stream(to);
    Event src_ready, copied;
    src_ready.record(src_stream);
    dst_stream.wait(src_ready);
    dispatch_device(
        "to_device", to, [] {},
        [&](auto stream) {
          kernels::cuda::memcpy_d2d(dst.data_ptr(), src.data_ptr(), src.nbytes(), stream);
        });
    copied.record(dst_stream);
    src_stream.wait(copied);
  }
}

} // namespace

Tensor copy(const Tensor& x) {
  check_defined("copy", "x", x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_device(
      "copy", x.device(),
      [&] {
        if (x.is_contiguous())
          std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
        else
          kernels::cpu::copy_strided(out.data_ptr(), x.data_ptr(), x.element_size(),
                                     strided_layout(x));
      },
      [&](auto stream) {
        if (x.is_contiguous())
          kernels::cuda::memcpy_d2d(out.data_ptr(), x.data_ptr(), x.nbytes(), stream);
        else
          kernels::cuda::copy_strided(out.data_ptr(), x.data_ptr(), x.element_size(),
                                      strided_layout(x), stream);
      });
  if (needs_grad({&x})) record(std::make_shared<IdentityBackward>(), {&x}, {&out});
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", "x", x);
  Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  dispatch_device(
      "cast", x.device(),
      [&] { kernels::cpu::cast(out.data_ptr(), dtype, xc.data_ptr(), x.dtype(), x.numel()); },
      [&](auto stream) {
        kernels::cuda::cast(out.data_ptr(), dtype, xc.data_ptr(), x.dtype(), x.numel(), stream);
      });
  check_finite("cast", out);
  if (needs_grad({&x}) && is_floating(dtype)) {
    auto node = std::make_shared<CastBackward>();
    node->in_dtype = x.dtype();
    record(node, {&x}, {&out});
  }
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  check_defined("to_device", "x", x);
  if (x.device() == device) return x;
  for (Device d : {x.device(), device})
    VLM_CHECK(d.is_cpu() || cuda_built(), "to_device: cannot move ", x.desc(), " to ", device.str(),
              ": ", cuda_device_query());
  Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  copy_between_devices(out, xc);
  if (needs_grad({&x})) {
    auto node = std::make_shared<ToDeviceBackward>();
    node->in_device = x.device();
    record(node, {&x}, {&out});
  }
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  check_defined("reshape", "x", x);
  Shape shape = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); i++) {
    if (shape[i] == -1) {
      VLM_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(shape_in));
      infer = int64_t(i);
    } else {
      VLM_CHECK(shape[i] >= 0, "reshape: negative dim in ", shape_str(shape_in));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    VLM_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 in ",
              shape_str(shape_in), " for ", x.desc());
    shape[infer] = x.numel() / known;
  }
  VLM_CHECK(numel(shape) == x.numel(), "reshape: ", x.desc(), " has ", x.numel(),
            " elements, cannot become ", shape_str(shape_in));
  Tensor base = x.contiguous();
  auto node = std::make_shared<ReshapeBackward>();
  node->in_shape = x.shape();
  // Reshaping `base` (already x's copy when x was strided) keeps the history of that copy.
  Tensor view = base.as_strided(shape, contiguous_strides(shape), base.offset());
  if (needs_grad({&base})) record(node, {&base}, {&view});
  return view;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  VLM_CHECK(s <= e, "flatten: start_dim ", start_dim, " after end_dim ", end_dim, " for ",
            x.desc());
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t m = 1;
  for (int64_t d = s; d <= e; d++) m *= x.shape()[d];
  shape.push_back(m);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape();
  shape.insert(shape.begin() + d, 1);
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  VLM_CHECK(x.shape()[d] == 1, "squeeze: dim ", dim, " of ", x.desc(), " is not 1");
  Shape shape = x.shape();
  shape.erase(shape.begin() + d);
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", "x", x);
  VLM_CHECK(int64_t(dims.size()) == x.dim(), "permute: ", dims.size(), " dims given for ",
            x.desc());
  std::vector<int64_t> inverse(dims.size(), -1);
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); i++) {
    int64_t d = wrap_dim(dims[i], x.dim(), "permute");
    VLM_CHECK(inverse[d] < 0, "permute: dim ", d, " repeated");
    inverse[d] = int64_t(i);
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  auto node = std::make_shared<PermuteBackward>();
  node->inverse = inverse;
  return make_view(x, x.as_strided(shape, strides, x.offset()), node);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(size_t(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(dim0, x.dim(), "transpose")], dims[wrap_dim(dim1, x.dim(), "transpose")]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  check_defined("slice", "x", x);
  int64_t d = wrap_dim(dim, x.dim(), "slice");
  int64_t n = x.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  VLM_CHECK(0 <= start && start <= end && end <= n, "slice: range [", start, ", ", end,
            ") out of bounds for dim ", d, " of ", x.desc());
  Shape shape = x.shape();
  shape[d] = end - start;
  auto node = std::make_shared<SliceBackward>();
  node->in_shape = x.shape();
  node->dim = d;
  node->start = start;
  node->end = end;
  return make_view(x, x.as_strided(shape, x.strides(), x.offset() + start * x.strides()[d]), node);
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  VLM_CHECK(!xs.empty(), "concat: no tensors");
  const Tensor& first = xs[0];
  int64_t d = wrap_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); i++) {
    const Tensor& t = xs[i];
    check_same_dtype("concat", "xs[0]", first, "xs[i]", t);
    check_same_device("concat", "xs[0]", first, "xs[i]", t);
    bool ok = t.dim() == first.dim();
    for (int64_t k = 0; ok && k < t.dim(); k++) ok = k == d || t.shape()[k] == shape[k];
    VLM_CHECK(ok, "concat: tensor ", i, " ", t.desc(), " does not match ", first.desc(),
              " outside dim ", d);
    total += t.shape()[d];
  }
  shape[d] = total;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t at = 0;
  std::vector<int64_t> sizes;
  {
    NoGradGuard no_grad;
    for (auto& t : xs) {
      Tensor view = slice(out, d, at, at + t.shape()[d]);
      copy_(view, t);
      at += t.shape()[d];
      sizes.push_back(t.shape()[d]);
    }
  }
  if (needs_grad(xs)) {
    auto node = std::make_shared<ConcatBackward>();
    node->dim = d;
    node->sizes = sizes;
    std::vector<const Tensor*> ins;
    for (auto& t : xs) ins.push_back(&t);
    record(std::static_pointer_cast<Node>(node), ins, {&out});
  }
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  check_defined("expand", "x", x);
  VLM_CHECK(int64_t(shape.size()) >= x.dim(), "expand: cannot expand ", x.desc(), " to ",
            shape_str(shape));
  Shape strides(shape.size(), 0);
  int64_t lead = int64_t(shape.size()) - x.dim();
  for (int64_t i = 0; i < x.dim(); i++) {
    int64_t s = x.shape()[i], t = shape[lead + i];
    VLM_CHECK(s == t || s == 1, "expand: dim ", i, " of ", x.desc(), " cannot become ", t,
              " (target ", shape_str(shape), ")");
    strides[lead + i] = s == t ? x.strides()[i] : 0;
  }
  auto node = std::make_shared<ExpandBackward>();
  node->in_shape = x.shape();
  return make_view(x, x.as_strided(shape, strides, x.offset()), node);
}

void copy_(Tensor& dst, const Tensor& src) {
  VLM_CHECK(dst.shape() == src.shape(), "copy_: shape mismatch, ", describe("dst", dst), " vs ",
            describe("src", src));
  if (dst.numel() == 0) return; // nothing to copy (an empty tensor may have no storage)
  NoGradGuard no_grad;
  Tensor s = src.dtype() == dst.dtype() ? src : cast(src, dst.dtype());
  Tensor sc = s.to(dst.device()).contiguous();
  dispatch_device(
      "copy_", dst.device(),
      [&] {
        if (dst.is_contiguous())
          std::memcpy(dst.data_ptr(), sc.data_ptr(), sc.nbytes());
        else
          kernels::cpu::copy_into_strided(dst.data_ptr(), strided_layout(dst), sc.data_ptr(),
                                          dst.element_size());
      },
      [&](auto stream) {
        if (dst.is_contiguous())
          kernels::cuda::memcpy_d2d(dst.data_ptr(), sc.data_ptr(), sc.nbytes(), stream);
        else
          kernels::cuda::copy_into_strided(dst.data_ptr(), strided_layout(dst), sc.data_ptr(),
                                           dst.element_size(), stream);
      });
}

} // namespace vlm
