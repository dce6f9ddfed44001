// rope and varlen attention against PyTorch (tools/golden/gen_attention.py): fp32 outputs and
// input gradients within kGoldenF32Tol, bf16 runs within the bf16 tolerances below, and rope in
// bf16 bit-exact against HF's bf16 arithmetic.
#include <cmath>

#include "src/core/ops/attention.h"
#include "src/core/ops/rope.h"
#include "tests/golden/golden.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::rel_error;

namespace {

// bf16 tolerance (max-norm relative error vs the fp32 golden): bf16 keeps 8 significant bits, so
// casting the inputs alone moves them by up to 2^-9 ~ 0.2% each; rope adds the rounding of cos/sin
// and of each product and sum (a few ulps), attention accumulates in fp32 and rounds its outputs
// once, but the input rounding passes through the softmax (which can amplify it by the score
// magnitude) and through three products in the backward. 2e-2 is ~10 bf16 ulps of the largest
// element: it catches wrong formulas, not rounding.
constexpr double kBf16Tol = 2e-2;

Tensor leaf(const Tensor& t) {
  Tensor l = t.detach();
  l.set_requires_grad(true);
  return l;
}

// Largest |a - b| in bf16 ulps of b (both hold bf16 values).
double max_bf16_ulps(const Tensor& a, const Tensor& b) {
  auto x = a.to_doubles(), y = b.to_doubles();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); i++) {
    int exponent = 0;
    std::frexp(y[i], &exponent);
    double ulp = std::ldexp(1.0, exponent - 8); // 8 significant bits, value in [2^(e-1), 2^e)
    worst = std::max(worst, y[i] == 0 ? std::abs(x[i]) * 1e30 : std::abs(x[i] - y[i]) / ulp);
  }
  return worst;
}

const char* kRopeCases[] = {"rope_d16_full", "rope_d16_partial", "rope_d72_full",
                            "rope_d72_partial"};
const char* kAttentionCases[] = {"attn_d16_causal_gqa4to2", "attn_d16_causal_gqa4to1",
                                 "attn_d16_bidir_gqa4to2",  "attn_d16_bidir_gqa4to1",
                                 "attn_d72_causal_gqa2to1", "attn_d72_bidir_gqa2to2"};

struct RopeCase {
  Tensor x, position_ids, grad_out;
  int64_t rotary_dim;
  double theta;
};

RopeCase load_rope(const Golden& g, const std::string& c) {
  return {g.get(c, "x"), g.get(c, "position_ids"), g.get(c, "grad_out"),
          int64_t(g.get(c, "rotary_dim").item()), g.get(c, "theta").item()};
}

// Runs rope in dtype and returns {out, grad_x} (both converted to f32).
std::pair<Tensor, Tensor> run_rope(const RopeCase& rc, DType dtype) {
  Tensor x = leaf(rc.x.to(dtype));
  Tensor out = rope(x, rc.position_ids, rc.rotary_dim, rc.theta);
  run_backward({out}, {rc.grad_out.to(dtype)});
  return {out.to(DType::f32), x.grad().to(DType::f32)};
}

struct AttentionCase {
  Tensor q, k, v, cu_seqlens, grad_out;
  bool causal;
  double scale;
};

AttentionCase load_attention(const Golden& g, const std::string& c) {
  return {g.get(c, "q"),           g.get(c, "k"),        g.get(c, "v"),
          g.get(c, "cu_seqlens"),  g.get(c, "grad_out"), g.get(c, "causal").item() != 0.0,
          g.get(c, "scale").item()};
}

// Runs attention in dtype and returns {out, grad_q, grad_k, grad_v} (converted to f32).
std::vector<Tensor> run_attention(const AttentionCase& ac, DType dtype) {
  Tensor q = leaf(ac.q.to(dtype)), k = leaf(ac.k.to(dtype)), v = leaf(ac.v.to(dtype));
  Tensor out = attention(q, k, v, ac.cu_seqlens, ac.causal, ac.scale);
  run_backward({out}, {ac.grad_out.to(dtype)});
  return {out.to(DType::f32), q.grad().to(DType::f32), k.grad().to(DType::f32),
          v.grad().to(DType::f32)};
}

} // namespace

TEST_CASE("rope: golden fp32 vs HF", "[golden]") {
  Golden g("attention");
  for (const char* c : kRopeCases) {
    INFO("case " << c);
    auto [out, grad_x] = run_rope(load_rope(g, c), DType::f32);
    CHECK(rel_error(out, g.get(c, "out")) <= kGoldenF32Tol);
    CHECK(rel_error(grad_x, g.get(c, "grad_x")) <= kGoldenF32Tol);
  }
}

TEST_CASE("rope: golden bf16 matches HF bf16 arithmetic", "[golden]") {
  Golden g("attention");
  for (const char* c : kRopeCases) {
    INFO("case " << c);
    auto [out, grad_x] = run_rope(load_rope(g, c), DType::bf16);
    CHECK(rel_error(out, g.get(c, "out")) <= kBf16Tol);
    CHECK(rel_error(grad_x, g.get(c, "grad_x")) <= kBf16Tol);
    // Same roundings as HF (cos/sin rounded to bf16, each product and sum rounded to bf16):
    // identical except where our fp32 cos/sin differ from torch's by an ulp right at a bf16
    // rounding boundary, so allow one bf16 ulp.
    CHECK(max_bf16_ulps(out, g.get(c, "out_bf16")) <= 1.0);
    CHECK(max_bf16_ulps(grad_x, g.get(c, "grad_x_bf16")) <= 1.0);
  }
}

TEST_CASE("attention: golden fp32 vs torch SDPA per document", "[golden]") {
  Golden g("attention");
  for (const char* c : kAttentionCases) {
    INFO("case " << c);
    auto r = run_attention(load_attention(g, c), DType::f32);
    CHECK(rel_error(r[0], g.get(c, "out")) <= kGoldenF32Tol);
    CHECK(rel_error(r[1], g.get(c, "grad_q")) <= kGoldenF32Tol);
    CHECK(rel_error(r[2], g.get(c, "grad_k")) <= kGoldenF32Tol);
    CHECK(rel_error(r[3], g.get(c, "grad_v")) <= kGoldenF32Tol);
  }
}

TEST_CASE("attention: golden bf16 vs torch SDPA per document", "[golden]") {
  Golden g("attention");
  for (const char* c : kAttentionCases) {
    INFO("case " << c);
    auto r = run_attention(load_attention(g, c), DType::bf16);
    CHECK(rel_error(r[0], g.get(c, "out")) <= kBf16Tol);
    CHECK(rel_error(r[1], g.get(c, "grad_q")) <= kBf16Tol);
    CHECK(rel_error(r[2], g.get(c, "grad_k")) <= kBf16Tol);
    CHECK(rel_error(r[3], g.get(c, "grad_v")) <= kBf16Tol);
  }
}
