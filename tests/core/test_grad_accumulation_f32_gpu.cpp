// Weight gradients of bf16 parameters in fp32 straight from the GEMM on CUDA (cuBLASLt with bf16
// inputs and an f32 output, beta = 1 into the f32 .grad; accumulate_weight_grad in
// src/core/autograd.h) against the CPU route on the same inputs: a bf16 Linear with weight and
// bias whose .grad accumulates in f32, over two backward passes. Both sum in fp32, only the
// order differs: max-norm relative error bound 1e-5 (the CPU route is 6e-7 / 8e-8 from the f64
// product; bf16 rounding of each pass would be ~2e-3). That GEMM checks itself at first use
// (src/core/ops/weight_grad_gemm.h): the tests run with VLM_GPU_SELF_CHECK=strict, so a failed
// check throws instead of falling back to the bf16 product, and the check's measure must pass for
// the layouts the weight gradients use, with weight_grad_gemm itself as the GEMM measured. The
// lm_head of linear_cross_entropy takes the same path. Skips (exit 77) without a device.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <utility>
#include <vector>

#include "src/core/ops.h"
#include "src/core/ops/weight_grad_gemm.h"
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

// Sets VLM_GPU_SELF_CHECK for the rest of the process (each TEST_CASE is its own process).
void strict_self_checks() { setenv("VLM_GPU_SELF_CHECK", "strict", 1); }

} // namespace

TEST_CASE("gpu grad accumulation f32: a bf16 Linear's weight and bias gradients match the CPU "
          "in fp32, hooks once per pass",
          "[gpu]") {
  require_device();
  strict_self_checks();
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

TEST_CASE("gpu grad accumulation f32: the weight-gradient GEMM passes its first-use check in the "
          "layouts used",
          "[gpu]") {
  require_device();
  strict_self_checks();
  using namespace vlm::ops_detail;
  // (true, false): g^T x for Linear and matmul weights, dl^T x for the lm_head; (false, false):
  // ones^T g for a bias.
  for (auto [trans_a, trans_b] : {std::pair{true, false}, std::pair{false, false}}) {
    INFO("trans_a " << trans_a << " trans_b " << trans_b);
    const double error = weight_grad_gemm_check_error(
        trans_a, trans_b, kGpu,
        [](float* c, const bf16* a, const bf16* b, const kernels::cpu::GemmShape& s, float beta) {
          weight_grad_gemm(c, a, b, s, beta, kGpu); // runs the check itself first (strict)
        });
    INFO("error " << error);
    CHECK(error <= kWeightGradGemmTolerance);
  }
}

TEST_CASE("gpu grad accumulation f32: a bf16 lm_head's gradient from linear_cross_entropy "
          "matches the CPU in f32",
          "[gpu]") {
  require_device();
  strict_self_checks();
  // Both sides round the logits' gradient to bf16 before the f32 product; a softmax value that
  // rounds the other way moves a row of dw by 2^-8 of one term, so 1e-2 as for bf16 in
  // test_loss_optim_gpu.cpp.
  Rng rng(35);
  const int64_t n = 130, h = 72, v = 5003, chunk = 1024;
  const Tensor w0 = Tensor::randn({v, h}, rng, DType::bf16, 0.2);
  Tensor w = f32_grad_leaf(w0, Device::cpu()), gw = f32_grad_leaf(w0, kGpu);
  for (int pass = 1; pass <= 2; pass++) {
    INFO("pass " << pass);
    const Tensor x = Tensor::randn({n, h}, rng, DType::bf16);
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = rng.randint(0, v);
    const Tensor labels = Tensor::from_vector(ids, {n});
    linear_cross_entropy(x, w, labels, -100, Reduction::mean, chunk).backward();
    linear_cross_entropy(x.to(kGpu), gw, labels.to(kGpu), -100, Reduction::mean, chunk).backward();
    REQUIRE(gw.grad().dtype() == DType::f32);
    CHECK(gw.grad().device() == kGpu);
    CHECK(rel_err(gw.grad(), w.grad()) <= 1e-2);
  }
}
