// Interleaved MRoPE tables (mrope_tables) against transformers' Qwen3VLTextRotaryEmbedding
// (tools/golden/gen_mrope.py) on the packed position ids of transformers' get_rope_index: the
// three mrope_section layouts of the tiny and the released models, fp32 and bf16. HF's tables are
// [T, head_dim] = concat(f, f); the golden and ours hold the R/2 slots once.
#include "src/core/ops/rope.h"
#include "tests/golden/golden.h"

using namespace vlm;
using vlm::testing::Golden;
using vlm::testing::kGoldenF32Tol;
using vlm::testing::rel_error;

namespace {

const char* kCases[] = {"mrope_d32_655", "mrope_d32_844", "mrope_d128_242020"};

RopeTables tables_of(const Golden& g, const std::string& c, DType dtype) {
  const Tensor s = g.get(c, "section");
  const std::vector<double> sec = s.to_doubles();
  REQUIRE(sec.size() == 3);
  return mrope_tables(g.get(c, "position_ids"), int64_t(g.get(c, "head_dim").item()),
                      g.get(c, "theta").item(), {int64_t(sec[0]), int64_t(sec[1]), int64_t(sec[2])},
                      dtype);
}

} // namespace

TEST_CASE("mrope: tables equal transformers' Qwen3-VL rotary embedding", "[golden]") {
  const Golden g("mrope");
  for (const char* c : kCases) {
    INFO("case " << c);
    const int64_t half = int64_t(g.get(c, "head_dim").item()) / 2;
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO("dtype " << dtype_name(dt));
      const std::string sfx = dt == DType::f32 ? "_f32" : "_bf16";
      const Tensor cos = g.get(c, "cos" + sfx), sin = g.get(c, "sin" + sfx);
      const RopeTables t = tables_of(g, c, dt);
      REQUIRE(t.cos.shape() == Shape{cos.size(0), half});
      // fp32: the angle is one fp32 product as in HF; cos/sin of it may differ by an ulp between
      // libm and torch. bf16: the same fp32 values rounded once, so at most one bf16 ulp apart.
      const double tol = dt == DType::f32 ? kGoldenF32Tol : 8e-3;
      CHECK(rel_error(t.cos.to(DType::f32), cos.to(DType::f32)) <= tol);
      CHECK(rel_error(t.sin.to(DType::f32), sin.to(DType::f32)) <= tol);
    }
  }
}

TEST_CASE("mrope: equal rows give exactly the 1-D tables, bad arguments are named", "[golden]") {
  const std::vector<int64_t> p = {0, 1, 2, 3, 0, 1, 7};
  std::vector<int64_t> three;
  for (int a = 0; a < 3; a++) three.insert(three.end(), p.begin(), p.end());
  const Tensor pos3 = Tensor::from_vector(three, {3, 7});
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const RopeTables m = mrope_tables(pos3, 32, 5e6, {8, 4, 4}, dt);
    const RopeTables r = rope_tables(Tensor::from_vector(p, {7}), 32, 5e6, dt);
    CHECK(m.cos.to_doubles() == r.cos.to_doubles());
    CHECK(m.sin.to_doubles() == r.sin.to_doubles());
  }
  CHECK_THROWS_WITH(mrope_tables(Tensor::from_vector(p, {7}), 32, 5e6, {8, 4, 4}, DType::f32),
                    Catch::Matchers::Contains("must be [3, T]"));
  CHECK_THROWS_WITH(mrope_tables(pos3, 32, 5e6, {8, 4, 5}, DType::f32),
                    Catch::Matchers::Contains("sum to rotary_dim / 2 = 16"));
}
