// Normalizations vs torch (tools/golden/gen_norm.py): HF Qwen3/Qwen3.5 RMSNorm formulas and
// F.layer_norm, forward and input/parameter gradients.
//
// Tolerances:
//  * fp32: rel_error <= kGoldenF32Tol (1e-5) for outputs and every gradient.
//  * bf16 vs the fp32 golden: our op on bf16-rounded inputs (and bf16 grad_out). Rounding the
//    inputs costs a relative 2^-9 each and every bf16 intermediate or result another 2^-9 at most
//    (accumulation is f32), so a handful of roundings stays well below 1.5e-2 of the max-norm:
//    rel_error <= kBf16OutTol = 1.5e-2 for outputs (observed <= 7e-3). Gradients also see the bf16
//    grad_out and the cancellation in dx = rstd (a - x̂ mean(a x̂)): kBf16GradTol = 2e-2
//    (observed <= 7.2e-3).
//  * bf16 vs torch evaluating the same HF formula in bf16 ("y_bf16"): with HF's rounding order
//    the outputs are bit-equal here; a differently ordered f32 sum may still flip a last bit, so
//    at most 1% of the elements may differ, each by at most 2^-7 |expected| (one bf16 ulp). A
//    wrong rounding order (e.g. w * x̂ rounded once in Qwen3's norm) differs in ~25% of them.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "src/core/ops/norm.h"
#include "tests/golden/golden.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::rel_error;

namespace {

constexpr double kBf16OutTol = 1.5e-2;
constexpr double kBf16GradTol = 2e-2;
constexpr double kHfMismatchFraction = 0.01;

const char* const kOperands[] = {"x", "z", "weight", "bias"};

struct Run {
  Tensor y;
  std::map<std::string, Tensor> grads; // "dx", "dweight", ...
};

Tensor apply(const std::string& kind, const std::map<std::string, Tensor>& in, double eps) {
  auto operand = [&](const char* key) { // undefined when the case has no such operand
    auto it = in.find(key);
    return it == in.end() ? Tensor() : it->second;
  };
  Tensor x = operand("x"), z = operand("z"), w = operand("weight"), b = operand("bias");
  if (kind == "rms") return rms_norm(x, w, eps);
  if (kind == "zc") return rms_norm_zero_centered(x, w, eps);
  if (kind == "gated") return rms_norm_gated(x, z, w, eps);
  return layer_norm(x, w, b, eps);
}

// Runs one golden case in `dtype`: forward, then backward with the stored grad_out.
Run run_case(const Golden& g, const std::string& name, const std::string& kind, DType dtype) {
  std::map<std::string, Tensor> in;
  for (const char* key : kOperands)
    if (g.has(name, key)) {
      in[key] = g.get(name, key, dtype).detach();
      in[key].set_requires_grad(true);
    }
  double eps = g.get(name, "eps").item();
  Run run;
  run.y = apply(kind, in, eps);
  run_backward({run.y}, {g.get(name, "grad_out", dtype)});
  for (auto& [key, t] : in) run.grads["d" + key] = t.grad();
  return run;
}

// Agreement with torch's bf16 evaluation of the same formula: the fraction of elements that are
// not bit-equal, and the largest difference relative to 2^-7 |expected| (one bf16 ulp or more).
struct Bf16Agreement {
  double mismatch_fraction = 0, max_ulps = 0;
};
Bf16Agreement bf16_agreement(const Tensor& actual, const Tensor& expected) {
  auto a = actual.to_doubles(), b = expected.to_doubles();
  Bf16Agreement r;
  for (size_t i = 0; i < a.size(); i++) {
    if (a[i] != b[i]) r.mismatch_fraction += 1.0 / double(a.size());
    double ulp = std::max(std::ldexp(std::abs(b[i]), -7), 1e-30);
    r.max_ulps = std::max(r.max_ulps, std::abs(a[i] - b[i]) / ulp);
  }
  return r;
}

void check_cases(const std::string& kind, const std::vector<std::string>& names) {
  Golden g("norm");
  for (const auto& name : names) {
    INFO("case " << name);
    Run f32 = run_case(g, name, kind, DType::f32);
    CHECK(rel_error(f32.y, g.get(name, "y")) <= kGoldenF32Tol);
    for (auto& [key, grad] : f32.grads) {
      INFO("fp32 " << key);
      REQUIRE(grad.defined());
      CHECK(rel_error(grad, g.get(name, key)) <= kGoldenF32Tol);
    }
    Run b16 = run_case(g, name, kind, DType::bf16);
    CHECK(b16.y.dtype() == DType::bf16);
    CHECK(rel_error(b16.y, g.get(name, "y")) <= kBf16OutTol);
    auto hf = bf16_agreement(b16.y, g.get(name, "y_bf16"));
    CHECK(hf.max_ulps <= 1.0);
    CHECK(hf.mismatch_fraction <= kHfMismatchFraction);
    for (auto& [key, grad] : b16.grads) {
      INFO("bf16 " << key);
      REQUIRE(grad.dtype() == DType::bf16);
      CHECK(rel_error(grad, g.get(name, key)) <= kBf16GradTol);
    }
  }
}

} // namespace

TEST_CASE("norm: golden rms_norm (Qwen3)", "[golden]") {
  check_cases("rms", {"rms_d64", "rms_d896_noweight", "rms_d32_eps5"});
}

TEST_CASE("norm: golden rms_norm_zero_centered (Qwen3.5)", "[golden]") {
  check_cases("zc", {"zc_d64", "zc_d40_noweight"});
}

TEST_CASE("norm: golden rms_norm_gated (Qwen3.5 GDN)", "[golden]") {
  check_cases("gated", {"gated_d64", "gated_d32_noweight"});
}

TEST_CASE("norm: golden layer_norm", "[golden]") {
  check_cases("ln", {"ln_d64", "ln_d48_noaffine", "ln_d40_weightonly"});
}
