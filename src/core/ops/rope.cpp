#include "src/core/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/rope.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/fused_norm_check.h"
#include "src/core/ops/index.h"
#include "src/core/ops/norm.h"
#include "src/core/ops/shape_ops.h"

namespace vlm {

using namespace ops_detail;

namespace {

// CUDA tensors take f32 and bf16 (no f64 kernels on the GPU).
void check_device(const char* op, DType dt, Device device) {
  if (device.is_cuda())
    VLM_CHECK(dt == DType::f32 || dt == DType::bf16, op, ": CUDA kernels take f32 or bf16, got ",
              dtype_name(dt), " (f64 runs on CPU only)");
}

kernels::RopeShape rope_shape(const Tensor& x, int64_t rotary_dim) {
  kernels::RopeShape s;
  s.tokens = x.size(0);
  s.heads = x.size(1);
  s.head_dim = x.size(2);
  s.rotary_dim = rotary_dim;
  return s;
}

struct RopeBackward final : Node {
  Tensor cos, sin;
  kernels::RopeShape shape;
  const char* name() const override { return "RopeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0].contiguous();
    Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
    dispatch(
        "rope backward", g.device(), g.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::rope_bwd<T>(dx.data<T>(), g.data<T>(), cos.data<T>(), sin.data<T>(), shape);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::rope_bwd<T>(dx.data<T>(), g.data<T>(), cos.data<T>(), sin.data<T>(), shape,
                                     stream);
        });
    return {dx};
  }
  void release() override { cos = sin = Tensor(); }
};

struct RmsNormRopeBackward final : Node {
  Tensor x, weight, rstd, cos, sin; // contiguous, no history; weight undefined for mode none
  kernels::RmsNormWeight mode = kernels::RmsNormWeight::none;
  kernels::RopeShape shape;
  const char* name() const override { return "RmsNormRopeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    VLM_CHECK(grads[0].shape() == x.shape() && grads[0].dtype() == x.dtype(), name(), ": ",
              describe("grad", grads[0]), " does not match ", describe("x", x));
    Tensor dy = grads[0].contiguous();
    Tensor dx = needs_input_grad(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor dw = weight.defined() && needs_input_grad(1)
                    ? Tensor::empty(weight.shape(), weight.dtype(), weight.device())
                    : Tensor();
    auto ptr = [](const Tensor& t, auto tag) {
      using T = decltype(tag);
      return t.defined() ? t.data<T>() : static_cast<T*>(nullptr);
    };
    dispatch(
        name(), x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::rms_norm_rope_bwd<T>(ptr(dx, t), ptr(dw, t), dy.data<T>(), x.data<T>(),
                                             ptr(weight, t), rstd.data<acc_t<T>>(), mode,
                                             cos.data<T>(), sin.data<T>(), shape);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          kernels::cuda::rms_norm_rope_bwd<T>(ptr(dx, t), ptr(dw, t), dy.data<T>(), x.data<T>(),
                                              ptr(weight, t), rstd.data<float>(), mode,
                                              cos.data<T>(), sin.data<T>(), shape, stream);
        });
    return {dx, dw};
  }
  void release() override { x = weight = rstd = cos = sin = Tensor(); }
};

} // namespace

RopeTables rope_tables(const Tensor& position_ids, int64_t rotary_dim, double theta, DType dtype) {
  check_defined("rope_tables", "position_ids", position_ids);
  VLM_CHECK(position_ids.dtype() == DType::i32 || position_ids.dtype() == DType::i64,
            "rope_tables: position_ids must be i32 or i64, got ",
            describe("position_ids", position_ids));
  VLM_CHECK(position_ids.dim() == 1, "rope_tables: position_ids must be [T], got ",
            describe("position_ids", position_ids));
  VLM_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0,
            "rope_tables: rotary_dim must be even and >= 2, got ", rotary_dim);
  VLM_CHECK(std::isfinite(theta) && theta > 0, "rope_tables: theta must be > 0, got ", theta);
  VLM_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
            "rope_tables: table dtype must be f32, f64 or bf16, got ", dtype_name(dtype));
  check_device("rope_tables", dtype, position_ids.device());
  const int64_t tokens = position_ids.size(0);
  RopeTables t;
  t.rotary_dim = rotary_dim;
  t.cos = Tensor::empty({tokens, rotary_dim / 2}, dtype, position_ids.device());
  t.sin = Tensor::empty({tokens, rotary_dim / 2}, dtype, position_ids.device());
  dispatch(
      "rope_tables", position_ids.device(), dtype,
      [&](auto tag) {
        using T = decltype(tag);
        Tensor positions = position_ids.to(DType::i64).contiguous();
        kernels::cpu::rope_cos_sin<T>(t.cos.data<T>(), t.sin.data<T>(), positions.data<int64_t>(),
                                      tokens, rotary_dim, theta);
      },
      [&](auto tag, void* stream) {
        using T = decltype(tag);
        Tensor positions = position_ids.contiguous(); // the kernel reads i32 or i64
        VLM_DISPATCH_INDEX(positions.dtype(), "rope_tables", I, [&] {
          kernels::cuda::rope_cos_sin<T, I>(t.cos.data<T>(), t.sin.data<T>(), positions.data<I>(),
                                            tokens, rotary_dim, theta, stream);
        });
      });
  return t;
}

RopeTables mrope_tables(const Tensor& position_ids, int64_t rotary_dim, double theta,
                        const std::array<int64_t, 3>& sections, DType dtype) {
  check_defined("mrope_tables", "position_ids", position_ids);
  VLM_CHECK(position_ids.dim() == 2 && position_ids.size(0) == 3,
            "mrope_tables: position_ids must be [3, T] (rows t, h, w), got ",
            describe("position_ids", position_ids));
  VLM_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0,
            "mrope_tables: rotary_dim must be even and >= 2, got ", rotary_dim);
  const int64_t half = rotary_dim / 2;
  VLM_CHECK(sections[0] >= 0 && sections[1] >= 0 && sections[2] >= 0 &&
                sections[0] + sections[1] + sections[2] == half,
            "mrope_tables: mrope_section (", sections[0], ", ", sections[1], ", ", sections[2],
            ") must be non-negative and sum to rotary_dim / 2 = ", half);
  // The tables of each row, side by side [T, 3 * R/2], then slot i picked from its row's block:
  // cos and sin are elementwise in the angle, so picking slots after them is picking angles.
  std::vector<RopeTables> rows;
  for (int64_t a = 0; a < 3; a++)
    rows.push_back(rope_tables(reshape(slice(position_ids, 0, a, a + 1), {position_ids.size(1)}),
                               rotary_dim, theta, dtype));
  std::vector<int64_t> pick(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++) {
    int64_t row = 0;
    if (i % 3 == 1 && i < 3 * sections[1]) row = 1;
    if (i % 3 == 2 && i < 3 * sections[2]) row = 2;
    pick[size_t(i)] = row * half + i;
  }
  // Through pinned memory: on a GPU the upload is asynchronous (no pageable copy in a step).
  Tensor staging = Tensor::empty_pinned({half}, DType::i64);
  std::copy(pick.begin(), pick.end(), staging.data<int64_t>());
  const Tensor index = staging.to(position_ids.device());
  RopeTables t;
  t.rotary_dim = rotary_dim;
  t.cos = index_select(concat({rows[0].cos, rows[1].cos, rows[2].cos}, 1), 1, index);
  t.sin = index_select(concat({rows[0].sin, rows[1].sin, rows[2].sin}, 1), 1, index);
  return t;
}

// The checks rope() and rms_norm_rope() share: x [T, H, D] float, tables [T, R/2] of x's dtype
// and device with R even, >= 2 and <= D.
void check_rope_operands(const char* op, const Tensor& x, const RopeTables& tables) {
  check_float(op, "x", x);
  check_dim(op, "x", x, 3);
  check_defined(op, "tables.cos", tables.cos);
  check_defined(op, "tables.sin", tables.sin);
  check_same_dtype(op, "x", x, "tables.cos", tables.cos);
  check_same_device(op, "x", x, "tables.cos", tables.cos);
  const int64_t rotary_dim = tables.rotary_dim, half = rotary_dim / 2;
  VLM_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= x.size(2), op, ": rotary_dim ",
            rotary_dim, " must be even, >= 2 and <= the head dim of ", describe("x", x),
            " (x is [T, H, D])");
  Shape table_shape{x.size(0), half};
  VLM_CHECK(tables.cos.shape() == table_shape && tables.sin.shape() == table_shape, op,
            ": tables must be [T, rotary_dim/2] = ", shape_str(table_shape), " for ",
            describe("x", x), ", got ", describe("cos", tables.cos), ", ",
            describe("sin", tables.sin));
  check_same_device(op, "x", x, "tables.sin", tables.sin);
  check_device(op, x.dtype(), x.device());
}

Tensor rope(const Tensor& x, const RopeTables& tables) {
  check_rope_operands("rope", x, tables);
  const int64_t rotary_dim = tables.rotary_dim;
  Tensor xc = x.contiguous(), cos = tables.cos.contiguous(), sin = tables.sin.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const kernels::RopeShape shape = rope_shape(x, rotary_dim);
  dispatch(
      "rope", x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::rope_fwd<T>(out.data<T>(), xc.data<T>(), cos.data<T>(), sin.data<T>(), shape);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::rope_fwd<T>(out.data<T>(), xc.data<T>(), cos.data<T>(), sin.data<T>(), shape,
                                   stream);
      });
  if (needs_grad({&x})) {
    auto node = std::make_shared<RopeBackward>();
    node->cos = cos.detach();
    node->sin = sin.detach();
    node->shape = shape;
    record(node, {&x}, {&out});
  }
  return out;
}

Tensor rms_norm_rope(const Tensor& x, const Tensor& weight, double eps, const RopeTables& tables,
                     bool zero_centered) {
  const char* op = "rms_norm_rope";
  check_rope_operands(op, x, tables);
  VLM_CHECK(x.size(2) > 0, op, ": x needs a non-empty head dim, got ", describe("x", x));
  VLM_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  if (weight.defined()) {
    check_same_dtype(op, "x", x, "weight", weight);
    check_same_device(op, "x", x, "weight", weight);
    VLM_CHECK(weight.dim() == 1 && weight.size(0) == x.size(2), op, ": ",
              describe("weight", weight), " must be [D] = (", x.size(2), ") for ",
              describe("x", x));
  }
  const kernels::RmsNormWeight mode = !weight.defined() ? kernels::RmsNormWeight::none
                                      : zero_centered   ? kernels::RmsNormWeight::offset
                                                        : kernels::RmsNormWeight::scale;
  // CUDA: the fused kernels once their first-use check passed (fused_norm_check.h), else the
  // primitives they fuse.
  if (x.device().is_cuda() &&
      !rms_norm_rope_cuda_passes(x.dtype(), x.size(2), tables.rotary_dim, mode, x.device()))
    return rope(zero_centered ? rms_norm_zero_centered(x, weight, eps) : rms_norm(x, weight, eps),
                tables);
  Tensor xc = plain(x), wc = plain(weight), cos = plain(tables.cos), sin = plain(tables.sin);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const DType stats = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor rstd = Tensor::empty({x.size(0) * x.size(1)}, stats, x.device());
  const kernels::RopeShape shape = rope_shape(x, tables.rotary_dim);
  auto w_ptr = [&](auto tag) {
    using T = decltype(tag);
    return wc.defined() ? wc.data<T>() : static_cast<const T*>(nullptr);
  };
  dispatch(
      op, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::rms_norm_rope_fwd<T>(out.data<T>(), rstd.data<acc_t<T>>(), xc.data<T>(),
                                           w_ptr(t), mode, cos.data<T>(), sin.data<T>(), shape,
                                           eps);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        kernels::cuda::rms_norm_rope_fwd<T>(out.data<T>(), rstd.data<float>(), xc.data<T>(),
                                            w_ptr(t), mode, cos.data<T>(), sin.data<T>(), shape,
                                            eps, stream);
      });
  if (needs_grad({&x, &weight})) {
    auto node = std::make_shared<RmsNormRopeBackward>();
    node->x = xc;
    node->weight = wc;
    node->rstd = rstd;
    node->cos = cos;
    node->sin = sin;
    node->mode = mode;
    node->shape = shape;
    record(node, {&x, &weight}, {&out});
  }
  return out;
}

Tensor rope(const Tensor& x, const Tensor& position_ids, int64_t rotary_dim, double theta) {
  check_float("rope", "x", x);
  check_dim("rope", "x", x, 3);
  check_defined("rope", "position_ids", position_ids);
  VLM_CHECK(position_ids.dim() == 1 && position_ids.size(0) == x.size(0),
            "rope: position_ids must be [T] for ", describe("x", x), " (x is [T, H, D]), got ",
            describe("position_ids", position_ids));
  return rope(x, rope_tables(position_ids, rotary_dim, theta, x.dtype()));
}

} // namespace vlm
