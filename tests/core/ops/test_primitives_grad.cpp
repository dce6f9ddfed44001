// Finite-difference checks of the primitive ops (the oracle that fused ops are tested against).
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::gradcheck;
using vlm::testing::leaf;

namespace {
Tensor rnd(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64));
}
} // namespace

TEST_CASE("grad: add/sub/mul/div with broadcasting", "[grad]") {
  auto a = rnd({2, 3, 4}, 1), b = rnd({3, 1}, 2);
  gradcheck("add", [](auto& in) { return add(in[0], in[1]); }, {a, b});
  gradcheck("sub", [](auto& in) { return sub(in[0], in[1]); }, {a, b});
  gradcheck("mul", [](auto& in) { return mul(in[0], in[1]); }, {a, b});
  Tensor pos = leaf(Tensor::from_doubles({1.5, 2.0, -1.7}, {3, 1}, DType::f64));
  gradcheck("div", [](auto& in) { return div(in[0], in[1]); }, {a, pos});
}

TEST_CASE("grad: affine, sum and mean", "[grad]") {
  auto x = rnd({3, 4, 5}, 3);
  gradcheck("affine", [](auto& in) { return affine(in[0], -1.5, 0.25); }, {x});
  gradcheck("sum dims", [](auto& in) { return sum(in[0], {0, 2}); }, {x});
  gradcheck("mean keepdim", [](auto& in) { return mean(in[0], {1}, true); }, {x});
  gradcheck("sum all", [](auto& in) { return sum(in[0]); }, {x});
}

TEST_CASE("grad: matmul and linear", "[grad]") {
  auto a = rnd({2, 3, 4}, 4), b = rnd({4, 5}, 5), bb = rnd({2, 4, 5}, 6);
  gradcheck("matmul 2d rhs", [](auto& in) { return matmul(in[0], in[1]); }, {a, b});
  gradcheck("matmul batched", [](auto& in) { return matmul(in[0], in[1]); }, {a, bb});
  auto w = rnd({6, 4}, 7), bias = rnd({6}, 8);
  gradcheck("linear", [](auto& in) { return linear(in[0], in[1], in[2]); }, {a, w, bias});
  gradcheck("linear no bias", [](auto& in) { return linear(in[0], in[1]); }, {a, w});
}

TEST_CASE("grad: views and concat", "[grad]") {
  auto x = rnd({3, 4, 2}, 9), y = rnd({3, 2, 2}, 10);
  gradcheck("transpose", [](auto& in) { return transpose(in[0], 0, 2).contiguous(); }, {x});
  gradcheck("permute+reshape",
            [](auto& in) {
              return reshape(permute(in[0], {1, 0, 2}), {4, 6});
            },
            {x});
  gradcheck("slice", [](auto& in) { return slice(in[0], 1, 1, 3).contiguous(); }, {x});
  gradcheck("concat", [](auto& in) { return concat({in[0], in[1]}, 1); }, {x, y});
  gradcheck("expand",
            [](auto& in) {
              return expand(slice(in[0], 1, 0, 1), {2, 3, 5, 2}).contiguous();
            },
            {x});
}

TEST_CASE("grad: cast through f32 and bf16", "[grad]") {
  // The round trip quantizes the perturbation, so the difference step must dwarf the rounding:
  // with eps 1e-2 the bf16 rounding (2^-8 relative) is a ~2e-2 relative error of the quotient.
  auto x = rnd({3, 4}, 11);
  testing::GradcheckOptions f32_opt;
  f32_opt.eps = 1e-3;
  f32_opt.rtol = 1e-3;
  f32_opt.atol = 1e-4;
  gradcheck(
      "cast f32", [](auto& in) { return cast(cast(in[0], DType::f32), DType::f64); }, {x}, f32_opt);
  testing::GradcheckOptions bf16_opt;
  bf16_opt.eps = 1e-1;
  bf16_opt.rtol = 5e-2;
  bf16_opt.atol = 5e-2;
  gradcheck(
      "cast bf16", [](auto& in) { return cast(cast(in[0], DType::bf16), DType::f64); }, {x},
      bf16_opt);
}
