// Finite-difference checks of rope (x) and attention (q, k, v), plus their bad-input messages.
#include "src/core/ops/attention.h"
#include "src/core/ops/rope.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::gradcheck;
using vlm::testing::leaf;

namespace {

Tensor rnd(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64));
}

Tensor cu_seqlens(const std::vector<int32_t>& offsets) {
  return Tensor::from_vector(offsets, {int64_t(offsets.size())});
}

} // namespace

TEST_CASE("rope: gradient full and partial rotary", "[grad]") {
  // Two documents whose positions restart at 0, one with a large position.
  Tensor pos = Tensor::from_vector<int64_t>({0, 1, 2, 0, 1000}, {5});
  auto x = rnd({5, 3, 8}, 11);
  gradcheck("rope full", [&](auto& in) { return rope(in[0], pos, 8, 10000.0); }, {x});
  gradcheck("rope partial", [&](auto& in) { return rope(in[0], pos, 4, 10000.0); }, {x});
  Tensor pos32 = Tensor::from_vector<int32_t>({3, 4, 5, 6, 7}, {5});
  auto y = rnd({5, 2, 6}, 12); // odd half (3 frequency slots), i32 positions
  gradcheck("rope i32 positions", [&](auto& in) { return rope(in[0], pos32, 6, 1e6); }, {y});
}

TEST_CASE("attention: gradient causal and bidirectional, MHA and GQA", "[grad]") {
  Tensor cu = cu_seqlens({0, 3, 4, 7}); // documents of 3, 1 and 3 tokens
  const int64_t T = 7;
  for (bool causal : {true, false}) {
    for (int64_t hkv : {int64_t(1), int64_t(2), int64_t(4)}) {
      auto q = rnd({T, 4, 8}, 21), k = rnd({T, hkv, 8}, 22), v = rnd({T, hkv, 8}, 23);
      gradcheck(std::string(causal ? "causal" : "bidirectional") + " Hkv=" + std::to_string(hkv),
                [&](auto& in) { return attention(in[0], in[1], in[2], cu, causal, 0.35); },
                {q, k, v});
    }
  }
}

TEST_CASE("attention: gradient odd head dim and a long document", "[grad]") {
  // D = 5 and a 140-token document span two of the CPU kernel's 128-row blocks (and two of the
  // backward's 128-key tiles).
  Tensor cu = cu_seqlens({0, 140, 142});
  auto q = rnd({142, 2, 5}, 31), k = rnd({142, 1, 5}, 32), v = rnd({142, 1, 5}, 33);
  gradcheck("long causal", [&](auto& in) { return attention(in[0], in[1], in[2], cu, true, 0.45); },
            {q, k, v});
}

TEST_CASE("attention: gradient of rope then attention", "[grad]") {
  Tensor cu = cu_seqlens({0, 4, 6});
  Tensor pos = Tensor::from_vector<int64_t>({0, 1, 2, 3, 0, 1}, {6});
  auto q = rnd({6, 2, 6}, 41), k = rnd({6, 1, 6}, 42), v = rnd({6, 1, 6}, 43);
  gradcheck("rope+attention",
            [&](auto& in) {
              Tensor qr = rope(in[0], pos, 4, 100.0), kr = rope(in[1], pos, 4, 100.0);
              return attention(qr, kr, in[2], cu, true, 1.0 / std::sqrt(6.0));
            },
            {q, k, v});
}

TEST_CASE("rope: bad input messages name the shapes", "[grad]") {
  Tensor x = Tensor::zeros({4, 2, 8});
  Tensor pos = Tensor::from_vector<int64_t>({0, 1, 2, 3}, {4});
  CHECK_THROWS_WITH(rope(Tensor::zeros({4, 16}), pos, 8, 1e4), Catch::Contains("f32(4, 16)"));
  CHECK_THROWS_WITH(rope(x, Tensor::from_vector<int64_t>({0, 1, 2}, {3}), 8, 1e4),
                    Catch::Contains("i64(3)") && Catch::Contains("f32(4, 2, 8)"));
  CHECK_THROWS_WITH(rope(x, pos, 10, 1e4),
                    Catch::Contains("rotary_dim 10") && Catch::Contains("f32(4, 2, 8)"));
  CHECK_THROWS_WITH(rope(x, pos, 3, 1e4), Catch::Contains("even"));
  CHECK_THROWS_WITH(rope(x, Tensor::zeros({4}), 8, 1e4), Catch::Contains("f32(4)"));
  RopeTables tables = rope_tables(pos, 8, 1e4, DType::f32);
  CHECK_THROWS_WITH(rope(Tensor::zeros({5, 2, 8}), tables),
                    Catch::Contains("f32(5, 2, 8)") && Catch::Contains("f32(4, 4)"));
  CHECK_THROWS_WITH(rope(Tensor::zeros({4, 2, 8}, DType::f64), tables),
                    Catch::Contains("dtype mismatch"));
}

TEST_CASE("attention: bad input messages name the shapes", "[grad]") {
  Tensor q = Tensor::zeros({6, 4, 8}), k = Tensor::zeros({6, 2, 8}), v = Tensor::zeros({6, 2, 8});
  Tensor cu = cu_seqlens({0, 2, 6});
  CHECK_NOTHROW(attention(q, k, v, cu, true, 1.0));
  CHECK_THROWS_WITH(attention(q, Tensor::zeros({6, 3, 8}), Tensor::zeros({6, 3, 8}), cu, true, 1),
                    Catch::Contains("f32(6, 4, 8)") && Catch::Contains("f32(6, 3, 8)"));
  CHECK_THROWS_WITH(attention(q, Tensor::zeros({5, 2, 8}), Tensor::zeros({5, 2, 8}), cu, true, 1),
                    Catch::Contains("f32(5, 2, 8)"));
  CHECK_THROWS_WITH(attention(q, k, Tensor::zeros({6, 2, 4}), cu, true, 1),
                    Catch::Contains("f32(6, 2, 4)"));
  CHECK_THROWS_WITH(attention(q, k, v, cu_seqlens({0, 2, 5}), true, 1),
                    Catch::Contains("cu_seqlens[2] = 5") && Catch::Contains("f32(6, 4, 8)"));
  CHECK_THROWS_WITH(attention(q, k, v, cu_seqlens({1, 2, 6}), true, 1),
                    Catch::Contains("cu_seqlens[0] must be 0"));
  CHECK_THROWS_WITH(attention(q, k, v, cu_seqlens({0, 4, 2, 6}), true, 1),
                    Catch::Contains("non-decreasing") && Catch::Contains("cu_seqlens[2] = 2"));
  CHECK_THROWS_WITH(attention(q, k, v, Tensor::from_vector<int64_t>({0, 6}, {2}), true, 1),
                    Catch::Contains("i32") && Catch::Contains("i64(2)"));
  CHECK_THROWS_WITH(attention(q, k.to(DType::f64), v, cu, true, 1),
                    Catch::Contains("dtype mismatch") && Catch::Contains("f64(6, 2, 8)"));
}
