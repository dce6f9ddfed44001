#include "src/core/ops/activation.h"

#include "kernels/activation.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"

namespace vlm {

using namespace ops_detail;
using kernels::UnaryOp;

namespace {

// One node type for every unary op: the kernel recomputes f'(x) from the saved input.
struct UnaryBackward final : Node {
  UnaryOp op;
  Tensor x; // contiguous
  const char* name() const override {
    switch (op) {
    case UnaryOp::sigmoid: return "SigmoidBackward";
    case UnaryOp::silu: return "SiluBackward";
    case UnaryOp::gelu_erf:
    case UnaryOp::gelu_tanh: return "GeluBackward";
    case UnaryOp::exp: return "ExpBackward";
    case UnaryOp::log: return "LogBackward";
    case UnaryOp::rsqrt: return "RsqrtBackward";
    case UnaryOp::square: return "SquareBackward";
    case UnaryOp::softplus: return "SoftplusBackward";
    }
    return "UnaryBackward";
  }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor dy = g[0].to(x.dtype()).contiguous();
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch(
        name(), x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::unary_bwd<T>(op, dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
        },
        [&](auto, void* stream) {
          kernels::cuda::unary_bwd(op, x.dtype(), dx.data_ptr(), dy.data_ptr(), x.data_ptr(),
                                   x.numel(), stream);
        });
    return {dx};
  }
  void release() override { x = Tensor(); }
};

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const char* op_name = unary_op_name(op);
  check_float(op_name, "x", x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch(
      op_name, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::unary_fwd<T>(op, out.data<T>(), x.data<T>(), x.numel());
      },
      [&](auto, void* stream) {
        kernels::cuda::unary_fwd(op, x.dtype(), out.data_ptr(), x.data_ptr(), x.numel(), stream);
      });
  check_finite(op_name, out);
  if (needs_grad({&x_in})) {
    auto node = std::make_shared<UnaryBackward>();
    node->op = op;
    node->x = x.detach();
    record(node, {&x_in}, {&out});
  }
  return out;
}

struct SwigluBackward final : Node {
  Tensor gate, up; // contiguous
  const char* name() const override { return "SwigluBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor dy = g[0].to(gate.dtype()).contiguous();
    Tensor dgate, dup;
    if (needs_input_grad(0)) dgate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    if (needs_input_grad(1)) dup = Tensor::empty(up.shape(), up.dtype(), up.device());
    dispatch(
        "swiglu backward", gate.device(), gate.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::swiglu_bwd<T>(dgate.defined() ? dgate.data<T>() : nullptr,
                                      dup.defined() ? dup.data<T>() : nullptr, dy.data<T>(),
                                      gate.data<T>(), up.data<T>(), gate.numel());
        },
        [&](auto, void* stream) {
          kernels::cuda::swiglu_bwd(gate.dtype(), dgate.defined() ? dgate.data_ptr() : nullptr,
                                    dup.defined() ? dup.data_ptr() : nullptr, dy.data_ptr(),
                                    gate.data_ptr(), up.data_ptr(), gate.numel(), stream);
        });
    return {dgate, dup};
  }
  void release() override { gate = up = Tensor(); }
};

struct SoftmaxBackward final : Node {
  Tensor y; // the forward output, contiguous
  const char* name() const override { return "SoftmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor dy = g[0].to(y.dtype()).contiguous();
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
    int64_t cols = y.shape().back(), rows = y.numel() / std::max<int64_t>(cols, 1);
    dispatch(
        "softmax backward", y.device(), y.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::softmax_bwd<T>(dx.data<T>(), dy.data<T>(), y.data<T>(), rows, cols);
        },
        [&](auto, void* stream) {
          kernels::cuda::softmax_bwd(y.dtype(), dx.data_ptr(), dy.data_ptr(), y.data_ptr(), rows,
                                     cols, stream);
        });
    return {dx};
  }
  void release() override { y = Tensor(); }
};

} // namespace

Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::silu, x); }
Tensor gelu(const Tensor& x, GeluApprox approx) {
  return unary(approx == GeluApprox::tanh ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, x);
}
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::square, x); }
Tensor softplus(const Tensor& x) { return unary(UnaryOp::softplus, x); }

Tensor swiglu(const Tensor& gate_in, const Tensor& up_in) {
  check_float("swiglu", "gate", gate_in);
  check_float("swiglu", "up", up_in);
  check_same_dtype("swiglu", "gate", gate_in, "up", up_in);
  check_same_device("swiglu", "gate", gate_in, "up", up_in);
  VLM_CHECK(gate_in.shape() == up_in.shape(), "swiglu: shape mismatch, ", describe("gate", gate_in),
            " vs ", describe("up", up_in));
  Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  dispatch(
      "swiglu", gate.device(), gate.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::swiglu_fwd<T>(out.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
      },
      [&](auto, void* stream) {
        kernels::cuda::swiglu_fwd(gate.dtype(), out.data_ptr(), gate.data_ptr(), up.data_ptr(),
                                  gate.numel(), stream);
      });
  check_finite("swiglu", out);
  if (needs_grad({&gate_in, &up_in})) {
    auto node = std::make_shared<SwigluBackward>();
    node->gate = gate.detach();
    node->up = up.detach();
    record(node, {&gate_in, &up_in}, {&out});
  }
  return out;
}

Tensor softmax(const Tensor& x_in) {
  check_float("softmax", "x", x_in);
  VLM_CHECK(x_in.dim() >= 1, "softmax: x needs at least 1 dim, got ", x_in.desc());
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  int64_t cols = x.shape().back(), rows = x.numel() / std::max<int64_t>(cols, 1);
  dispatch(
      "softmax", x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::softmax_fwd<T>(out.data<T>(), x.data<T>(), rows, cols);
      },
      [&](auto, void* stream) {
        kernels::cuda::softmax_fwd(x.dtype(), out.data_ptr(), x.data_ptr(), rows, cols, stream);
      });
  check_finite("softmax", out);
  if (needs_grad({&x_in})) {
    auto node = std::make_shared<SoftmaxBackward>();
    node->y = out.detach();
    record(node, {&x_in}, {&out});
  }
  return out;
}

} // namespace vlm
