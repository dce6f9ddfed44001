// Weight gradients of bf16 parameters in fp32 straight from the GEMM on CUDA (cuBLASLt with bf16
// inputs and an f32 output, beta = 1 into the f32 .grad; accumulate_weight_grad in
// src/core/autograd.h) against the CPU route on the same inputs: a bf16 Linear with weight and
// bias whose .grad accumulates in f32, over two backward passes. Both sum in fp32, only the
// order differs: max-norm relative error bound 1e-5 (the CPU route is 6e-7 / 8e-8 from the f64
// product; bf16 rounding of each pass would be ~2e-3). Skips (exit 77) without a device.
#include <catch2/catch.hpp>

#include "src/core/ops.h"
#include "tests/gpu_testing.h"

using namespace vlm;

using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;

namespace {

Tensor f32_grad_leaf(const Tensor& values, Device device) {
  Tensor t = values.to(device).detach().set_requires_grad(true);
  t.set_grad_dtype(DType::f32);
  return t;
}

} // namespace

TEST_CASE("gpu grad accumulation f32: a bf16 Linear's weight and bias gradients match the CPU "
          "in fp32, hooks once per pass",
          "[gpu]") {
  require_device();
  Rng rng(34);
  const int64_t rows = 4099, in = 72, out = 40; // no size a multiple of a tile
  const Tensor w0 = Tensor::randn({out, in}, rng, DType::bf16);
  const Tensor b0 = Tensor::randn({out}, rng, DType::bf16);
  Tensor w = f32_grad_leaf(w0, Device::cpu()), b = f32_grad_leaf(b0, Device::cpu());
  Tensor gw = f32_grad_leaf(w0, kGpu), gb = f32_grad_leaf(b0, kGpu);
  int hooks = 0;
  gw.register_post_accumulate_grad_hook([&](Tensor&) { hooks++; });
  for (int pass = 1; pass <= 2; pass++) {
    const Tensor x = Tensor::randn({rows, in}, rng, DType::bf16);
    const Tensor g = Tensor::randn({rows, out}, rng, DType::bf16);
    linear(x, w, b).backward(g);
    linear(x.to(kGpu), gw, gb).backward(g.to(kGpu));
    CHECK(hooks == pass);
    REQUIRE(gw.grad().dtype() == DType::f32);
    REQUIRE(gb.grad().dtype() == DType::f32);
    CHECK(gw.grad().device() == kGpu);
    INFO("pass " << pass);
    CHECK(rel_err(gw.grad(), w.grad()) <= 1e-5);
    CHECK(rel_err(gb.grad(), b.grad()) <= 1e-5);
  }
}
