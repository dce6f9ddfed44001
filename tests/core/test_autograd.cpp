#include <catch2/catch.hpp>

#include "src/core/ops.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::leaf;

TEST_CASE("autograd: gradients accumulate across uses and calls", "[core]") {
  Tensor x = leaf(Tensor::from_doubles({1, 2, 3}, {3}));
  Tensor y = sum(add(mul(x, x), x)); // d/dx = 2x + 1
  y.backward();
  CHECK(x.grad().to_doubles() == std::vector<double>{3, 5, 7});
  sum(x).backward(); // accumulates +1
  CHECK(x.grad().to_doubles() == std::vector<double>{4, 6, 8});
}

TEST_CASE("autograd: NoGradGuard records nothing", "[core]") {
  Tensor x = leaf(Tensor::from_doubles({1, 2}, {2}));
  NoGradGuard g;
  Tensor y = mul(x, x);
  CHECK_FALSE(y.requires_grad());
}

TEST_CASE("autograd: post-accumulate hooks run after the leaf gradient is final", "[core]") {
  Tensor w = leaf(Tensor::from_doubles({1, 2}, {2}));
  std::vector<double> seen;
  int calls = 0;
  w.register_post_accumulate_grad_hook([&](Tensor& p) {
    calls++;
    seen = p.grad().to_doubles();
  });
  // w is used twice; the hook must see the summed gradient once.
  Tensor y = sum(add(scale(w, 2.0), scale(w, 3.0)));
  y.backward();
  CHECK(calls == 1);
  CHECK(seen == std::vector<double>{5, 5});
}

TEST_CASE("autograd: checkpoint recomputes and matches the plain graph", "[core]") {
  Rng rng(7);
  Tensor w = leaf(Tensor::randn({4, 4}, rng, DType::f64));
  Tensor x0 = Tensor::randn({3, 4}, rng, DType::f64);
  auto block = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{mul(linear(in[0], w), in[0])};
  };
  Tensor x = leaf(x0);
  sum(block({x})[0]).backward();
  auto gw_plain = w.grad().to_doubles();
  auto gx_plain = x.grad().to_doubles();
  w.zero_grad();
  Tensor x2 = leaf(x0);
  int runs = 0;
  auto counted = [&](const std::vector<Tensor>& in) {
    runs++;
    return block(in);
  };
  Tensor out = checkpoint(counted, {x2})[0];
  CHECK(runs == 1);
  sum(out).backward();
  CHECK(runs == 2);
  CHECK(w.grad().to_doubles() == gw_plain);
  CHECK(x2.grad().to_doubles() == gx_plain);
}

TEST_CASE("autograd: in-place update of a tensor that requires grad is refused", "[core]") {
  Tensor w = leaf(Tensor::from_doubles({1, 2}, {2}));
  CHECK_THROWS_WITH(scale_(w, 2.0), Catch::Contains("NoGradGuard"));
  NoGradGuard g;
  scale_(w, 2.0);
  CHECK(w.to_doubles() == std::vector<double>{2, 4});
}
