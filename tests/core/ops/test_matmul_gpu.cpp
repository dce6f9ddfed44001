// matmul / linear / linear_from_output on CUDA tensors (cuBLASLt through kernels/gemm.h)
// against the CPU ops on the same inputs, forward and backward. Tolerances (max-norm relative
// error, max|cuda - cpu| / max|cpu|): f32 1e-5 (both fp32 arithmetic, only the summation order
// differs); bf16 1e-2 (both accumulate in fp32 and round each output once, so an element differs
// by at most about one bf16 rounding, 2^-8 relative). Skips (exit 77) without a device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/core/ops.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

double tolerance(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }

// A leaf on the device holding the same values as the CPU leaf `host`.
Tensor on_gpu(const Tensor& host) { return host.to(kGpu).detach().set_requires_grad(true); }
Tensor leaf(const Shape& shape, Rng& rng, DType dt) {
  return Tensor::randn(shape, rng, dt).set_requires_grad(true);
}

} // namespace

TEST_CASE("gpu matmul: 2-D, batched and batch-by-matrix match the CPU op, forward and backward",
          "[gpu]") {
  require_device();
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {{{37, 53}, {53, 29}},            // no size a multiple of a tile
                        {{1, 7}, {7, 1}},                // vector-like
                        {{3, 17, 19}, {3, 19, 23}},      // batched
                        {{2, 3, 33, 65}, {2, 3, 65, 9}}, // two batch dims
                        {{4, 31, 40}, {40, 12}},         // batch of matrices times one matrix
                        {{70000, 8}, {8, 5}}};           // rows > 65535
  for (DType dt : {DType::f32, DType::bf16}) {
    Rng rng(7);
    for (const Case& c : cases) {
      INFO("dtype " << dtype_name(dt) << " a " << shape_str(c.a) << " b " << shape_str(c.b));
      Tensor a = leaf(c.a, rng, dt), b = leaf(c.b, rng, dt);
      Tensor ga = on_gpu(a), gb = on_gpu(b);
      Tensor want = matmul(a, b), got = matmul(ga, gb);
      CHECK(got.device() == kGpu);
      CHECK(got.dtype() == dt);
      CHECK(rel_err(got, want) <= tolerance(dt));
      Tensor up = Tensor::randn(want.shape(), rng, dt);
      want.backward(up);
      got.backward(up.to(kGpu));
      CHECK(rel_err(ga.grad(), a.grad()) <= tolerance(dt));
      CHECK(rel_err(gb.grad(), b.grad()) <= tolerance(dt));
    }
  }
}

TEST_CASE("gpu linear: with and without bias, rows > 65535, forward and backward", "[gpu]") {
  require_device();
  struct Case {
    Shape x;
    int64_t out;
    bool bias;
  };
  const Case cases[] = {{{5, 7, 33}, 19, true},
                        {{5, 7, 33}, 19, false},
                        {{1, 64}, 128, true},
                        {{70001, 12}, 10, true}};
  for (DType dt : {DType::f32, DType::bf16}) {
    Rng rng(11);
    for (const Case& c : cases) {
      INFO("dtype " << dtype_name(dt) << " x " << shape_str(c.x) << " out " << c.out << " bias "
                    << c.bias);
      const int64_t in = c.x.back();
      Tensor x = leaf(c.x, rng, dt), w = leaf({c.out, in}, rng, dt);
      Tensor bias = c.bias ? leaf({c.out}, rng, dt) : Tensor();
      Tensor gx = on_gpu(x), gw = on_gpu(w), gbias = c.bias ? on_gpu(bias) : Tensor();
      Tensor want = linear(x, w, bias), got = linear(gx, gw, gbias);
      CHECK(got.device() == kGpu);
      CHECK(rel_err(got, want) <= tolerance(dt));
      Tensor up = Tensor::randn(want.shape(), rng, dt);
      want.backward(up);
      got.backward(up.to(kGpu));
      CHECK(rel_err(gx.grad(), x.grad()) <= tolerance(dt));
      CHECK(rel_err(gw.grad(), w.grad()) <= tolerance(dt));
      if (c.bias) CHECK(rel_err(gbias.grad(), bias.grad()) <= tolerance(dt));
    }
  }
}

TEST_CASE("gpu linear_from_output: backward of a recomputed output matches the CPU op", "[gpu]") {
  require_device();
  Rng rng(3);
  Tensor x = leaf({9, 21}, rng, DType::f32), w = leaf({14, 21}, rng, DType::f32);
  Tensor bias = leaf({14}, rng, DType::f32);
  Tensor gx = on_gpu(x), gw = on_gpu(w), gbias = on_gpu(bias);
  Tensor y_cpu, y_gpu;
  {
    NoGradGuard no_grad;
    y_cpu = linear(x, w, bias);
    y_gpu = linear(gx, gw, gbias);
  }
  Tensor want = linear_from_output(x, w, bias, y_cpu);
  Tensor got = linear_from_output(gx, gw, gbias, y_gpu);
  CHECK(rel_err(got, want) <= 1e-5);
  Tensor up = Tensor::randn(want.shape(), rng);
  want.backward(up);
  got.backward(up.to(kGpu));
  CHECK(rel_err(gx.grad(), x.grad()) <= 1e-5);
  CHECK(rel_err(gw.grad(), w.grad()) <= 1e-5);
  CHECK(rel_err(gbias.grad(), bias.grad()) <= 1e-5);
}

TEST_CASE("gpu matmul: f64 and mixed devices are rejected with the shapes", "[gpu]") {
  require_device();
  Rng rng(5);
  Tensor a = Tensor::randn({4, 3}, rng, DType::f64).to(kGpu);
  Tensor b = Tensor::randn({3, 2}, rng, DType::f64).to(kGpu);
  const std::string msg = testing::error_of([&] { matmul(a, b); });
  CHECK(msg.find("f64") != std::string::npos);
  Tensor c = Tensor::randn({3, 2}, rng);
  CHECK(testing::error_of([&] {
          matmul(Tensor::randn({4, 3}, rng).to(kGpu), c);
        }).find("device") != std::string::npos);
}
