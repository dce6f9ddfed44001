#include "src/core/ops/elementwise.h"

#include "kernels/copy.h"
#include "kernels/elementwise.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/reduce.h"

namespace vlm {

using namespace ops_detail;
using kernels::BinaryOp;

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; i++) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    VLM_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
              " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

kernels::BroadcastLayout broadcast_layout(const Shape& out, const Tensor& a, const Tensor& b) {
  VLM_CHECK(out.size() <= size_t(kernels::kMaxDims), "at most ", kernels::kMaxDims, " dims");
  kernels::BroadcastLayout l;
  l.ndim = int(out.size());
  auto fill = [&](const Tensor& t, int64_t* stride) {
    size_t lead = out.size() - size_t(t.dim());
    for (size_t i = 0; i < out.size(); i++)
      stride[i] = i < lead || t.shape()[i - lead] == 1 ? 0 : t.strides()[i - lead];
  };
  for (size_t i = 0; i < out.size(); i++) l.shape[i] = out[i];
  fill(a, l.stride_a);
  fill(b, l.stride_b);
  return l;
}

Tensor binary(const char* op_name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_float(op_name, "a", a);
  check_float(op_name, "b", b);
  check_same_dtype(op_name, "a", a, "b", b);
  check_same_device(op_name, "a", a, "b", b);
  Shape shape = broadcast_shapes(op_name, a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  auto layout = broadcast_layout(shape, a, b);
  dispatch(
      op_name, a.device(), a.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::binary_fwd<T>(op, out.data<T>(), static_cast<const T*>(a.data_ptr()),
                                    static_cast<const T*>(b.data_ptr()), layout);
      },
      [&](auto, void* stream) {
        kernels::cuda::binary_fwd(op, a.dtype(), out.data_ptr(), a.data_ptr(), b.data_ptr(), layout,
                                  stream);
      });
  check_finite(op_name, out);
  return out;
}

struct AddBackward final : Node {
  Shape a_shape, b_shape;
  double b_sign = 1.0; // -1 for sub
  const char* name() const override { return b_sign > 0 ? "AddBackward" : "SubBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor ga = needs_input_grad(0) ? sum_to(g[0], a_shape) : Tensor();
    Tensor gb;
    if (needs_input_grad(1)) gb = b_sign > 0 ? sum_to(g[0], b_shape) : neg(sum_to(g[0], b_shape));
    return {ga, gb};
  }
};

struct MulBackward final : Node {
  Tensor a, b;
  const char* name() const override { return "MulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor ga = needs_input_grad(0) ? sum_to(mul(g[0], b), a.shape()) : Tensor();
    Tensor gb = needs_input_grad(1) ? sum_to(mul(g[0], a), b.shape()) : Tensor();
    return {ga, gb};
  }
  void release() override { a = b = Tensor(); }
};

struct DivBackward final : Node {
  Tensor a, b;
  const char* name() const override { return "DivBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor ga = needs_input_grad(0) ? sum_to(div(g[0], b), a.shape()) : Tensor();
    // d(a/b)/db = -a / b^2
    Tensor gb =
        needs_input_grad(1) ? sum_to(neg(div(mul(g[0], a), mul(b, b))), b.shape()) : Tensor();
    return {ga, gb};
  }
  void release() override { a = b = Tensor(); }
};

struct AffineBackward final : Node {
  double alpha;
  const char* name() const override { return "AffineBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {scale(g[0], alpha)}; }
};

void check_inplace(const char* op, const Tensor& dst) {
  check_float(op, "dst", dst);
  VLM_CHECK(!(GradMode::is_enabled() && dst.requires_grad()), op,
            ": in-place update of a tensor that requires grad while grad mode is on (", dst.desc(),
            "); wrap it in NoGradGuard");
}

} // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary("add", BinaryOp::add, a, b);
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<AddBackward>();
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    record(node, {&a, &b}, {&out});
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary("sub", BinaryOp::sub, a, b);
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<AddBackward>();
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    node->b_sign = -1.0;
    record(node, {&a, &b}, {&out});
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary("mul", BinaryOp::mul, a, b);
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<MulBackward>();
    node->a = a.detach();
    node->b = b.detach();
    record(node, {&a, &b}, {&out});
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary("div", BinaryOp::div, a, b);
  if (needs_grad({&a, &b})) {
    auto node = std::make_shared<DivBackward>();
    node->a = a.detach();
    node->b = b.detach();
    record(node, {&a, &b}, {&out});
  }
  return out;
}

Tensor affine(const Tensor& x, double alpha, double beta) {
  check_float("affine", "x", x);
  Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch(
      "affine", x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::affine_fwd<T>(out.data<T>(), xc.data<T>(), alpha, beta, x.numel());
      },
      [&](auto, void* stream) {
        kernels::cuda::affine_fwd(x.dtype(), out.data_ptr(), xc.data_ptr(), alpha, beta, x.numel(),
                                  stream);
      });
  check_finite("affine", out);
  if (needs_grad({&x})) {
    auto node = std::make_shared<AffineBackward>();
    node->alpha = alpha;
    record(node, {&x}, {&out});
  }
  return out;
}

void add_(Tensor& dst, const Tensor& src, double alpha) {
  check_inplace("add_", dst);
  VLM_CHECK(dst.shape() == src.shape(), "add_: shape mismatch, ", describe("dst", dst), " vs ",
            describe("src", src));
  check_same_dtype("add_", "dst", dst, "src", src);
  check_same_device("add_", "dst", dst, "src", src);
  VLM_CHECK(dst.is_contiguous(), "add_: dst must be contiguous, got ", dst.desc());
  Tensor s = src.contiguous();
  dispatch(
      "add_", dst.device(), dst.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::axpy<T>(dst.data<T>(), s.data<T>(), alpha, dst.numel());
      },
      [&](auto, void* stream) {
        kernels::cuda::axpy(dst.dtype(), dst.data_ptr(), s.data_ptr(), alpha, dst.numel(), stream);
      });
}

void scale_(Tensor& dst, double s) {
  check_inplace("scale_", dst);
  VLM_CHECK(dst.is_contiguous(), "scale_: dst must be contiguous, got ", dst.desc());
  dispatch(
      "scale_", dst.device(), dst.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::affine_fwd<T>(dst.data<T>(), dst.data<T>(), s, 0.0, dst.numel());
      },
      [&](auto, void* stream) {
        kernels::cuda::affine_fwd(dst.dtype(), dst.data_ptr(), dst.data_ptr(), s, 0.0, dst.numel(),
                                  stream);
      });
}

void fill_(Tensor& dst, double value) {
  check_inplace("fill_", dst);
  VLM_CHECK(dst.is_contiguous(), "fill_: dst must be contiguous, got ", dst.desc());
  dispatch_device(
      "fill_", dst.device(),
      [&] { kernels::cpu::fill(dst.data_ptr(), dst.dtype(), value, dst.numel()); },
      [&](auto stream) {
        kernels::cuda::fill(dst.data_ptr(), dst.dtype(), value, dst.numel(), stream);
      });
}

} // namespace vlm
