// The multi-tensor gradient norm and clipping on CUDA (kernels/optim.h multi_sum_squares /
// multi_scale behind optim::grad_norm_squared, scale_grads and clip_grad_norm_async) against the
// CPU reference (optim::clip_grad_norm on the same gradients). Tolerances (relative):
//   norm²: 1e-12 (fp64 partials of squares of the same values, summed in another order: the
//     difference is a few fp64 roundings, ~1e-15 observed for such sums on the CPU);
//   clip coefficient: 1e-12 (the same fp64 formula on a norm within 1e-12);
//   clipped gradients, max-norm relative: f32 1e-6, bf16 4e-3 (the same fp32 product of the
//     same values: bitwise equal unless the coefficient's fp32 rounding differs by one ulp, which
//     moves an f32 element by ~1e-7 and may flip a bf16 rounding by one bf16 ulp, 2^-8 of the
//     element at most);
//   repeats: bitwise (a fixed reduction order, no atomics).
// Launches and host reads are counted with kernels/gpu_runtime.h's counters: clipping with the
// norm left on the device makes no host read and no synchronization (after the kernels' first-use
// self-check, which reads the device and is run before counting).
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "kernels/optim.h"
#include "src/base/rng.h"
#include "src/optim/grad_clip.h"
#include "src/optim/grad_clip_check.h"
#include "tests/gpu_testing.h"

using namespace vlm;
using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

// The same gradients as CPU parameters and as CUDA parameters (a copy each).
struct Params {
  std::vector<Tensor> cpu, cuda;
};

// One parameter per size, dtypes alternating f32 / bf16 from `first_bf16`, gradients
// randn * scale; plus a CUDA and a CPU parameter without a gradient (skipped).
Params make_params(const std::vector<int64_t>& sizes, uint64_t seed, double scale,
                   bool first_bf16 = false) {
  Rng rng(seed);
  Params p;
  for (size_t i = 0; i < sizes.size(); i++) {
    const DType dt = (i % 2 == 1) != first_bf16 ? DType::bf16 : DType::f32;
    const Tensor g = Tensor::randn({sizes[i]}, rng, dt, scale);
    Tensor pc = Tensor::zeros({sizes[i]}, dt);
    pc.set_requires_grad(true);
    pc.set_grad(g.clone());
    Tensor pg = gpu(Tensor::zeros({sizes[i]}, dt));
    pg.set_requires_grad(true);
    pg.set_grad(gpu(g));
    p.cpu.push_back(pc);
    p.cuda.push_back(pg);
  }
  Tensor no_grad_gpu = gpu(Tensor::zeros({3}));
  no_grad_gpu.set_requires_grad(true);
  p.cuda.push_back(no_grad_gpu);
  Tensor no_grad_cpu = Tensor::zeros({3});
  no_grad_cpu.set_requires_grad(true);
  p.cpu.push_back(no_grad_cpu);
  return p;
}

// Mixed sizes: odd ones, chunk edges (32768), above 2^20 and one above 3 * 2^20.
const std::vector<int64_t> kSizes = {
    1, 7, 32767, 32768, 32769, 5, 1 << 20, (1 << 20) + 3, 100003, 3 * (1 << 20) + 1, 33, 65537};

double rel(double got, double want) { return std::abs(got - want) / std::abs(want); }

// Runs the multi-tensor kernels' first-use self-check for the dtype mix of `params` (it reads the
// device), so that a counted call counts the call alone.
void self_check_first(const std::vector<Tensor>& params) {
  bool f32 = false, bf16 = false;
  for (const Tensor& p : params)
    if (p.grad().defined()) (p.grad().dtype() == DType::bf16 ? bf16 : f32) = true;
  REQUIRE(optim::multi_tensor_grad_kernels_pass(kGpu, f32, bf16));
}

// Clips the CPU copy with optim::clip_grad_norm (the reference) and the CUDA copy with
// clip_grad_norm_async, then compares norm, coefficient and every gradient.
void compare_clip(const Params& p, double max_norm, bool expect_clipped) {
  INFO("max_norm " << max_norm);
  std::vector<Tensor> before;
  for (const Tensor& t : p.cuda) before.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
  const double want_norm = optim::clip_grad_norm(p.cpu, max_norm);
  const double want_coef = optim::clip_coefficient(want_norm, max_norm);
  REQUIRE((want_coef < 1.0) == expect_clipped);

  self_check_first(p.cuda);
  const auto c0 = kernels::cuda::launch_counts();
  const Tensor out = optim::clip_grad_norm_async(p.cuda, max_norm);
  const auto c1 = kernels::cuda::launch_counts();
  CHECK(out.device() == kGpu);
  CHECK(out.dtype() == DType::f64);
  // No host read, no synchronization; a handful of launches (3: sum of squares, partials, scale;
  // allocations may add poison fills in test builds).
  CHECK(c1.d2h_copies == c0.d2h_copies);
  CHECK(c1.syncs == c0.syncs);
  CHECK(c1.kernels - c0.kernels >= 3);
  CHECK(c1.kernels - c0.kernels <= 5);

  const std::vector<double> v = out.to_doubles();
  REQUIRE(v.size() == 2);
  CHECK(rel(std::sqrt(v[0]), want_norm) <= 1e-12);
  CHECK(rel(v[1], want_coef) <= 1e-12);
  size_t compared = 0;
  for (size_t i = 0; i < p.cuda.size(); i++) {
    if (!p.cuda[i].grad().defined()) continue;
    INFO("tensor " << i << " " << p.cuda[i].grad().desc());
    const double tol = p.cuda[i].dtype() == DType::bf16 ? 4e-3 : 1e-6;
    CHECK(rel_err(p.cuda[i].grad(), p.cpu[i].grad()) <= tol);
    if (expect_clipped) {
      CHECK_FALSE(same_bits(p.cuda[i].grad(), before[i])); // really scaled
    } else {
      CHECK(same_bits(p.cuda[i].grad(), before[i])); // untouched
    }
    compared++;
  }
  CHECK(compared == kSizes.size());
}

} // namespace

TEST_CASE("gpu multi-tensor grad norm: mixed sizes and dtypes match the CPU, bitwise on repeat",
          "[gpu]") {
  require_device();
  for (bool first_bf16 : {false, true}) {
    INFO("first tensor bf16 " << first_bf16);
    const Params p = make_params(kSizes, 21 + first_bf16, 0.01, first_bf16);
    const double want = optim::grad_norm_squared(p.cpu);
    const double got = optim::grad_norm_squared(p.cuda);
    CHECK(rel(got, want) <= 1e-12);
    const double again = optim::grad_norm_squared(p.cuda);
    CHECK(std::memcmp(&got, &again, sizeof got) == 0);
    // The device result, twice: the same bits, and the same value as the host read.
    const Tensor a = optim::clip_grad_norm_async(p.cuda, 0.0),
                 b = optim::clip_grad_norm_async(p.cuda, 0.0);
    CHECK(same_bits(a, b));
    const std::vector<double> va = a.to_doubles();
    CHECK(std::memcmp(&va[0], &got, sizeof got) == 0);
    CHECK(va[1] == 1.0); // max_norm 0: no clipping
  }
}

TEST_CASE("gpu multi-tensor clip: scaled on the device exactly when the norm exceeds max_norm",
          "[gpu]") {
  require_device();
  // The norm of these gradients is about 0.01 * sqrt(5.3M) ~ 23.
  SECTION("clipped") { compare_clip(make_params(kSizes, 5, 0.01), 1.0, true); }
  SECTION("not clipped") { compare_clip(make_params(kSizes, 6, 0.01), 1e6, false); }
  SECTION("host coefficient (scale_grads) matches the CPU scale") {
    Params p = make_params(kSizes, 7, 1.0);
    optim::scale_grads(p.cpu, 0.37);
    optim::scale_grads(p.cuda, 0.37);
    for (size_t i = 0; i + 1 < p.cuda.size(); i++) {
      INFO("tensor " << i);
      CHECK(rel_err(p.cuda[i].grad(), p.cpu[i].grad()) <= (i % 2 ? 4e-3 : 1e-6));
    }
  }
}

TEST_CASE("gpu multi-tensor clip: a non-finite norm is reported and nothing is scaled", "[gpu]") {
  require_device();
  for (double bad : {double(NAN), double(INFINITY)}) {
    Params p = make_params({1000, 70000, 5}, 9, 10.0);
    Tensor g = p.cuda[1].grad().to(Device::cpu());
    g.data<bf16>()[40000] = bf16(float(bad)); // tensor 1 is bf16
    p.cuda[1].set_grad(gpu(g));
    const Tensor kept = p.cuda[0].grad().clone();
    const std::vector<double> v = optim::clip_grad_norm_async(p.cuda, 1.0).to_doubles();
    CHECK_FALSE(std::isfinite(v[0]));
    CHECK(v[1] == 1.0);
    CHECK(same_bits(p.cuda[0].grad(), kept));
  }
}

TEST_CASE("gpu multi-tensor clip: more tensors than one launch takes", "[gpu]") {
  require_device();
  // 2500 tensors: three descriptor tables per kernel.
  Rng sizes_rng(13);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 2500; i++) sizes.push_back(1 + int64_t(sizes_rng.randint(0, 3000)));
  const Params p = make_params(sizes, 14, 0.05);
  const double want_sq = optim::grad_norm_squared(p.cpu);
  self_check_first(p.cuda);
  const auto c0 = kernels::cuda::launch_counts();
  const Tensor out = optim::clip_grad_norm_async(p.cuda, 1.0);
  const auto c1 = kernels::cuda::launch_counts();
  const int64_t tables =
      (2500 + kernels::cuda::kGradSpansPerLaunch - 1) / kernels::cuda::kGradSpansPerLaunch;
  CHECK(c1.kernels - c0.kernels >= uint64_t(2 * tables + 1));
  CHECK(c1.kernels - c0.kernels <= uint64_t(2 * tables + 3));
  CHECK(c1.syncs == c0.syncs);
  const std::vector<double> v = out.to_doubles();
  CHECK(rel(v[0], want_sq) <= 1e-12);
  const double coef = optim::clip_coefficient(std::sqrt(want_sq), 1.0);
  REQUIRE(coef < 1.0);
  optim::scale_grads(p.cpu, coef); // the reference: the CPU copy, scaled in place
  for (size_t i = 0; i < sizes.size(); i += 97) {
    INFO("tensor " << i);
    CHECK(rel_err(p.cuda[i].grad(), p.cpu[i].grad()) <= (i % 2 ? 4e-3 : 1e-6));
  }
  std::printf("multi-tensor clip of %zu tensors: %llu launches\n", sizes.size(),
              (unsigned long long)(c1.kernels - c0.kernels));
}
