#include "src/core/ops/norm.h"

#include <cmath>

#include "kernels/norm.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/fused_norm_check.h"

namespace vlm {

using namespace ops_detail;
using kernels::RmsNormWeight;

namespace {

// Per-row statistics are kept in the accumulation type: f64 for f64 tensors, f32 otherwise.
DType stats_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

template <typename T> const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <typename T> T* out_ptr(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

int64_t rows_of(const Tensor& x) { return x.numel() / x.size(-1); }

void check_input(const char* op, const Tensor& x, double eps) {
  check_float(op, "x", x);
  VLM_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": x needs a non-empty last dim, got ",
            describe("x", x));
  VLM_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
}

// weight / bias / gate: optional (unless `required`), x's dtype and device, shape [D] or x's.
void check_operand(const char* op, const char* name, const Tensor& t, const Tensor& x,
                   bool like_x) {
  if (!t.defined()) return;
  check_float(op, name, t);
  check_same_dtype(op, "x", x, name, t);
  check_same_device(op, "x", x, name, t);
  if (like_x)
    VLM_CHECK(t.shape() == x.shape(), op, ": ", describe(name, t), " must have the shape of ",
              describe("x", x));
  else
    VLM_CHECK(t.dim() == 1 && t.size(0) == x.size(-1), op, ": ", describe(name, t),
              " must be [D] = (", x.size(-1), ") for ", describe("x", x));
}

// The upstream gradient as a contiguous tensor of x's dtype.
Tensor grad_like(const char* op, const Tensor& g, const Tensor& x) {
  VLM_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), op, ": ", describe("grad", g),
            " does not match ", describe("x", x));
  return g.contiguous();
}

Tensor empty_like(const Tensor& like) {
  return Tensor::empty(like.shape(), like.dtype(), like.device());
}

Tensor empty_if(bool wanted, const Tensor& like) { return wanted ? empty_like(like) : Tensor(); }

// One per-row statistic of x (mean or rstd), as the forward kernels write it.
Tensor row_stats(const Tensor& x) {
  return Tensor::empty({rows_of(x)}, stats_dtype(x.dtype()), x.device());
}

struct RmsNormBackward final : Node {
  Tensor x, weight, rstd; // contiguous, no history; weight undefined for mode none
  RmsNormWeight mode = RmsNormWeight::none;
  const char* name() const override {
    return mode == RmsNormWeight::offset ? "RmsNormZeroCenteredBackward" : "RmsNormBackward";
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor dy = grad_like(name(), grads[0], x);
    Tensor dx = empty_if(needs_input_grad(0), x);
    Tensor dw = empty_if(weight.defined() && needs_input_grad(1), weight);
    dispatch(
        name(), x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::rms_norm_bwd<T>(out_ptr<T>(dx), out_ptr<T>(dw), dy.data<T>(), x.data<T>(),
                                        ptr_or_null<T>(weight), rstd.data<acc_t<T>>(), mode,
                                        rows_of(x), x.size(-1));
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::rms_norm_bwd<T>(out_ptr<T>(dx), out_ptr<T>(dw), dy.data<T>(), x.data<T>(),
                                         ptr_or_null<T>(weight), rstd.data<float>(), mode,
                                         rows_of(x), x.size(-1), stream);
        });
    return {dx, dw};
  }
  void release() override { x = weight = rstd = Tensor(); }
};

struct AddRmsNormBackward final : Node {
  Tensor s, weight, rstd; // the sum (contiguous, detached), weight undefined for mode none
  RmsNormWeight mode = RmsNormWeight::none;
  const char* name() const override { return "AddRmsNormBackward"; }
  // grads: {d(sum), d(y)}; returns {dx, dh, dw} with dx = dh = d(sum) + the norm's input gradient.
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor ds_in = grad_like(name(), grads[0], s);
    Tensor dy = grad_like(name(), grads[1], s);
    Tensor ds = empty_if(needs_input_grad(0) || needs_input_grad(1), s);
    Tensor dw = empty_if(weight.defined() && needs_input_grad(2), weight);
    dispatch(
        name(), s.device(), s.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::add_rms_norm_bwd<T>(out_ptr<T>(ds), out_ptr<T>(dw), ds_in.data<T>(),
                                            dy.data<T>(), s.data<T>(), ptr_or_null<T>(weight),
                                            rstd.data<acc_t<T>>(), mode, rows_of(s), s.size(-1));
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::add_rms_norm_bwd<T>(
              out_ptr<T>(ds), out_ptr<T>(dw), ds_in.data<T>(), dy.data<T>(), s.data<T>(),
              ptr_or_null<T>(weight), rstd.data<float>(), mode, rows_of(s), s.size(-1), stream);
        });
    return {needs_input_grad(0) ? ds : Tensor(), needs_input_grad(1) ? ds : Tensor(), dw};
  }
  void release() override { s = weight = rstd = Tensor(); }
};

struct RmsNormGatedBackward final : Node {
  Tensor x, z, weight, rstd;
  const char* name() const override { return "RmsNormGatedBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor dy = grad_like(name(), grads[0], x);
    Tensor dx = empty_if(needs_input_grad(0), x);
    Tensor dz = empty_if(needs_input_grad(1), z);
    Tensor dw = empty_if(weight.defined() && needs_input_grad(2), weight);
    dispatch(
        name(), x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::rms_norm_gated_bwd<T>(
              out_ptr<T>(dx), out_ptr<T>(dz), out_ptr<T>(dw), dy.data<T>(), x.data<T>(),
              z.data<T>(), ptr_or_null<T>(weight), rstd.data<acc_t<T>>(), rows_of(x), x.size(-1));
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::rms_norm_gated_bwd<T>(out_ptr<T>(dx), out_ptr<T>(dz), out_ptr<T>(dw),
                                               dy.data<T>(), x.data<T>(), z.data<T>(),
                                               ptr_or_null<T>(weight), rstd.data<float>(),
                                               rows_of(x), x.size(-1), stream);
        });
    return {dx, dz, dw};
  }
  void release() override { x = z = weight = rstd = Tensor(); }
};

struct LayerNormBackward final : Node {
  Tensor x, weight, mean, rstd;
  bool has_bias = false;
  const char* name() const override { return "LayerNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor dy = grad_like(name(), grads[0], x);
    int64_t dim = x.size(-1);
    Tensor dx = empty_if(needs_input_grad(0), x);
    Tensor dw = weight.defined() && needs_input_grad(1)
                    ? Tensor::empty({dim}, x.dtype(), x.device())
                    : Tensor();
    Tensor db =
        has_bias && needs_input_grad(2) ? Tensor::empty({dim}, x.dtype(), x.device()) : Tensor();
    dispatch(
        name(), x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::layer_norm_bwd<T>(out_ptr<T>(dx), out_ptr<T>(dw), out_ptr<T>(db),
                                          dy.data<T>(), x.data<T>(), ptr_or_null<T>(weight),
                                          mean.data<acc_t<T>>(), rstd.data<acc_t<T>>(), rows_of(x),
                                          dim);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::layer_norm_bwd<T>(out_ptr<T>(dx), out_ptr<T>(dw), out_ptr<T>(db),
                                           dy.data<T>(), x.data<T>(), ptr_or_null<T>(weight),
                                           mean.data<float>(), rstd.data<float>(), rows_of(x), dim,
                                           stream);
        });
    return {dx, dw, db};
  }
  void release() override { x = weight = mean = rstd = Tensor(); }
};

RmsNormWeight rms_weight_mode(const Tensor& weight, bool zero_centered) {
  return !weight.defined() ? RmsNormWeight::none
         : zero_centered   ? RmsNormWeight::offset
                           : RmsNormWeight::scale;
}

Tensor rms_norm_impl(const char* op, const Tensor& x, const Tensor& weight, double eps,
                     bool zero_centered) {
  check_input(op, x, eps);
  check_operand(op, "weight", weight, x, false);
  check_cuda_dtype(op, x);
  const RmsNormWeight mode = rms_weight_mode(weight, zero_centered);
  Tensor xc = plain(x), wc = plain(weight);
  Tensor out = empty_like(x), rstd = row_stats(x);
  dispatch(
      op, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::rms_norm_fwd<T>(out.data<T>(), rstd.data<acc_t<T>>(), xc.data<T>(),
                                      ptr_or_null<T>(wc), mode, rows_of(x), x.size(-1), eps);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::rms_norm_fwd<T>(out.data<T>(), rstd.data<float>(), xc.data<T>(),
                                       ptr_or_null<T>(wc), mode, rows_of(x), x.size(-1), eps,
                                       stream);
      });
  if (needs_grad({&x, &weight})) {
    auto node = std::make_shared<RmsNormBackward>();
    node->x = xc;
    node->weight = wc;
    node->rstd = rstd;
    node->mode = mode;
    record(node, {&x, &weight}, {&out}); // an undefined weight gets an empty edge
  }
  return out;
}

} // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return rms_norm_impl("rms_norm", x, weight, eps, false);
}

Tensor rms_norm_zero_centered(const Tensor& x, const Tensor& weight, double eps) {
  return rms_norm_impl("rms_norm_zero_centered", x, weight, eps, true);
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& h, const Tensor& weight,
                                       double eps, bool zero_centered) {
  const char* op = "add_rms_norm";
  check_input(op, x, eps);
  check_defined(op, "h", h);
  check_operand(op, "h", h, x, true);
  check_operand(op, "weight", weight, x, false);
  check_cuda_dtype(op, x);
  const RmsNormWeight mode = rms_weight_mode(weight, zero_centered);
  // The CUDA kernels run once their first-use check passed (src/core/ops/fused_norm_check.h);
  // otherwise the primitives they fuse, with their own kernels and autograd.
  if (x.device().is_cuda() && !add_rms_norm_cuda_passes(x.dtype(), x.size(-1), mode, x.device())) {
    Tensor sum = add(x, h);
    return {sum,
            zero_centered ? rms_norm_zero_centered(sum, weight, eps) : rms_norm(sum, weight, eps)};
  }
  Tensor xc = plain(x), hc = plain(h), wc = plain(weight);
  Tensor sum = empty_like(x), out = empty_like(x), rstd = row_stats(x);
  dispatch(
      op, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::add_rms_norm_fwd<T>(sum.data<T>(), out.data<T>(), rstd.data<acc_t<T>>(),
                                          xc.data<T>(), hc.data<T>(), ptr_or_null<T>(wc), mode,
                                          rows_of(x), x.size(-1), eps);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::add_rms_norm_fwd<T>(sum.data<T>(), out.data<T>(), rstd.data<float>(),
                                           xc.data<T>(), hc.data<T>(), ptr_or_null<T>(wc), mode,
                                           rows_of(x), x.size(-1), eps, stream);
      });
  if (needs_grad({&x, &h, &weight})) {
    auto node = std::make_shared<AddRmsNormBackward>();
    node->s = sum.detach(); // not `sum` itself: its grad_fn is this node
    node->weight = wc;
    node->rstd = rstd;
    node->mode = mode;
    record(node, {&x, &h, &weight}, {&sum, &out});
  }
  return {sum, out};
}

Tensor rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, double eps) {
  const char* op = "rms_norm_gated";
  check_input(op, x, eps);
  check_defined(op, "z", z);
  check_operand(op, "z", z, x, true);
  check_operand(op, "weight", weight, x, false);
  check_cuda_dtype(op, x);
  Tensor xc = plain(x), zc = plain(z), wc = plain(weight);
  Tensor out = empty_like(x), rstd = row_stats(x);
  dispatch(
      op, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::rms_norm_gated_fwd<T>(out.data<T>(), rstd.data<acc_t<T>>(), xc.data<T>(),
                                            zc.data<T>(), ptr_or_null<T>(wc), rows_of(x),
                                            x.size(-1), eps);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::rms_norm_gated_fwd<T>(out.data<T>(), rstd.data<float>(), xc.data<T>(),
                                             zc.data<T>(), ptr_or_null<T>(wc), rows_of(x),
                                             x.size(-1), eps, stream);
      });
  if (needs_grad({&x, &z, &weight})) {
    auto node = std::make_shared<RmsNormGatedBackward>();
    node->x = xc;
    node->z = zc;
    node->weight = wc;
    node->rstd = rstd;
    record(node, {&x, &z, &weight}, {&out});
  }
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  check_input(op, x, eps);
  check_operand(op, "weight", weight, x, false);
  check_operand(op, "bias", bias, x, false);
  check_cuda_dtype(op, x);
  Tensor xc = plain(x), wc = plain(weight), bc = plain(bias);
  Tensor out = empty_like(x), mean = row_stats(x), rstd = row_stats(x);
  dispatch(
      op, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::layer_norm_fwd<T>(out.data<T>(), mean.data<acc_t<T>>(), rstd.data<acc_t<T>>(),
                                        xc.data<T>(), ptr_or_null<T>(wc), ptr_or_null<T>(bc),
                                        rows_of(x), x.size(-1), eps);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::layer_norm_fwd<T>(out.data<T>(), mean.data<float>(), rstd.data<float>(),
                                         xc.data<T>(), ptr_or_null<T>(wc), ptr_or_null<T>(bc),
                                         rows_of(x), x.size(-1), eps, stream);
      });
  if (needs_grad({&x, &weight, &bias})) {
    auto node = std::make_shared<LayerNormBackward>();
    node->x = xc;
    node->weight = wc;
    node->mean = mean;
    node->rstd = rstd;
    node->has_bias = bias.defined();
    record(node, {&x, &weight, &bias}, {&out});
  }
  return out;
}

Tensor l2_normalize(const Tensor& x, double eps) {
  const char* op = "l2_normalize";
  check_input(op, x, eps);
  const double dim = double(x.size(-1));
  const Tensor xw = x.dtype() == DType::bf16 ? x.to(DType::f32) : x;
  return scale(rms_norm(xw, Tensor(), eps / dim), 1.0 / std::sqrt(dim)).to(x.dtype());
}

} // namespace vlm
