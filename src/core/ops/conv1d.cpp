#include "src/core/ops/conv1d.h"

#include "kernels/conv1d.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"

namespace vlm {

using namespace ops_detail;

namespace {

constexpr const char* kOp = "causal_conv1d";

[[noreturn]] void no_cuda_kernel() { VLM_FAIL(kOp, ": no CUDA kernel yet (CPU only)"); }

struct CausalConv1dBackward final : Node {
  Tensor x, weight, cu_seqlens; // contiguous, no history; cu_seqlens a private CPU copy
  bool silu = false;
  const char* name() const override { return "CausalConv1dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    VLM_CHECK(grads[0].shape() == x.shape() && grads[0].dtype() == x.dtype(), name(), ": ",
              describe("grad", grads[0]), " does not match ", describe("x", x));
    Tensor dy = grads[0].contiguous();
    Tensor dx = needs_input_grad(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor dw =
        needs_input_grad(1) ? Tensor::empty(weight.shape(), x.dtype(), x.device()) : Tensor();
    dispatch(
        name(), x.device(), x.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::causal_conv1d_bwd<T>(
              dx.defined() ? dx.data<T>() : nullptr, dw.defined() ? dw.data<T>() : nullptr,
              dy.data<T>(), x.data<T>(), weight.data<T>(), cu_seqlens.data<int32_t>(),
              cu_seqlens.size(0) - 1, x.size(0), x.size(1), weight.size(1), silu);
        },
        [&](auto, void*) { no_cuda_kernel(); });
    return {dx, dw};
  }
  void release() override { x = weight = cu_seqlens = Tensor(); }
};

} // namespace

Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& cu_seqlens, bool silu) {
  check_float(kOp, "x", x);
  check_float(kOp, "weight", weight);
  check_same_dtype(kOp, "x", x, "weight", weight);
  check_same_device(kOp, "x", x, "weight", weight);
  check_dim(kOp, "x", x, 2);
  check_dim(kOp, "weight", weight, 2);
  VLM_CHECK(weight.size(0) == x.size(1) && weight.size(1) >= 1, kOp, ": ",
            describe("weight", weight), " must be [C, K] with K >= 1 for ", describe("x", x),
            " ([T, C])");
  // A private host copy: backward must see the validated offsets.
  Tensor cu = cu_seqlens.defined() && cu_seqlens.device().is_cpu() ? cu_seqlens.contiguous().clone()
                                                                   : cu_seqlens;
  check_cu_seqlens(kOp, cu, "x", x);
  Tensor xc = plain(x), wc = plain(weight);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch(
      kOp, x.device(), x.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::causal_conv1d_fwd<T>(out.data<T>(), xc.data<T>(), wc.data<T>(),
                                           cu.data<int32_t>(), cu.size(0) - 1, x.size(0), x.size(1),
                                           weight.size(1), silu);
      },
      [&](auto, void*) { no_cuda_kernel(); });
  if (needs_grad({&x, &weight})) {
    auto node = std::make_shared<CausalConv1dBackward>();
    node->x = xc;
    node->weight = wc;
    node->cu_seqlens = cu;
    node->silu = silu;
    record(node, {&x, &weight}, {&out});
  }
  return out;
}

} // namespace vlm
