// The measure of the weight-gradient GEMM's first-use self-check (src/core/ops/weight_grad_gemm.h)
// on the CPU, with CPU stand-ins for the GEMM under test: the CPU bf16 x bf16 -> f32 kernel passes
// for every layout (it too sums in fp32 against the f64 reference), while the path before issue 34
// (the product rounded to bf16, then added), a GEMM that drops beta's term and one that reads the
// output when beta = 0 fail. The cuBLASLt call itself is checked in
// tests/core/test_grad_accumulation_f32_gpu.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "src/core/ops/weight_grad_gemm.h"
#include "tests/error_of.h"

using namespace vlm;
using namespace vlm::ops_detail;
using kernels::cpu::GemmShape;

namespace {

const Device kCpu = Device::cpu();

void cpu_gemm(float* c, const bf16* a, const bf16* b, const GemmShape& s, float beta) {
  kernels::cpu::gemm_bf16_f32(c, a, b, s, 1.f, beta);
}

double error_of_gemm(bool trans_a, bool trans_b, const Bf16F32Gemm& gemm) {
  return weight_grad_gemm_check_error(trans_a, trans_b, kCpu, gemm);
}

} // namespace

TEST_CASE("matmul weight-gradient gemm self-check: the CPU kernel passes in every layout") {
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true}) {
      INFO("trans_a " << trans_a << " trans_b " << trans_b);
      CHECK(error_of_gemm(trans_a, trans_b, cpu_gemm) <= kWeightGradGemmTolerance);
    }
}

TEST_CASE("matmul weight-gradient gemm self-check: wrong products fail it") {
  // Before issue 34: the product rounded to bf16, widened and added.
  auto rounded = [](float* c, const bf16* a, const bf16* b, const GemmShape& s, float beta) {
    std::vector<bf16> product(size_t(s.M * s.N));
    kernels::cpu::gemm<bf16>(product.data(), a, b, s);
    for (size_t i = 0; i < product.size(); i++)
      c[i] = (beta == 0.f ? 0.f : c[i]) + float(product[i]);
  };
  // beta = 1 treated as 0: the .grad's previous contents lost.
  auto overwrites = [](float* c, const bf16* a, const bf16* b, const GemmShape& s, float) {
    cpu_gemm(c, a, b, s, 0.f);
  };
  // beta = 0 treated as 1: reads a fresh .grad's garbage (NaN in the check).
  auto reads_fresh = [](float* c, const bf16* a, const bf16* b, const GemmShape& s, float) {
    cpu_gemm(c, a, b, s, 1.f);
  };
  const double rounded_error = error_of_gemm(true, false, rounded);
  CHECK(rounded_error > 10 * kWeightGradGemmTolerance);
  CHECK(rounded_error < 1e-2); // one bf16 rounding, nothing worse
  CHECK(error_of_gemm(false, false, overwrites) > 10 * kWeightGradGemmTolerance);
  CHECK(std::isinf(error_of_gemm(true, false, reads_fresh)));
}

TEST_CASE("matmul weight-gradient gemm: beta is 0 or 1") {
  std::vector<bf16> a(4, bf16(1.f)), b(4, bf16(1.f));
  std::vector<float> c(4, 1.f);
  GemmShape s;
  s.M = s.N = s.K = 2;
  weight_grad_gemm(c.data(), a.data(), b.data(), s, 1.f, kCpu);
  CHECK(c == std::vector<float>(4, 3.f));
  CHECK_THAT(vlm::testing::error_of(
                 [&] { weight_grad_gemm(c.data(), a.data(), b.data(), s, 0.5f, kCpu); }),
             Catch::Contains("beta must be 0 or 1"));
}
