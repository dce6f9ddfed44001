// The normalization ops vs their composition from primitive ops (mean, mul, sub, add, affine) in
// f64: forward and every input gradient, relative error <= 1e-12.
//
// rsqrt and silu are the primitive elementwise ops of src/core/ops/activation.h (themselves
// checked by finite differences and against torch).
// Also here: the error messages for bad input, the node names, and bit-identical parameter
// gradients for any OpenMP thread count.
#include <omp.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "src/core/ops/activation.h"
#include "src/core/ops/norm.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::leaf;
using vlm::testing::max_rel_error;

namespace {

constexpr double kComposeTol = 1e-12;

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0, double mean = 0.0) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64, std, mean));
}

// x̂ = x * rsqrt(mean(x^2) + eps) over the last dim.
Tensor rms_hat(const Tensor& x, double eps) {
  return mul(x, rsqrt(affine(mean(mul(x, x), {-1}, true), 1.0, eps)));
}

Tensor layer_norm_composite(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  Tensor centred = sub(x, mean(x, {-1}, true));
  Tensor y = mul(centred, rsqrt(affine(mean(mul(centred, centred), {-1}, true), 1.0, eps)));
  if (w.defined()) y = mul(y, w);
  if (b.defined()) y = add(y, b);
  return y;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fused and composite on the same leaves with the same upstream gradient and compares the
// outputs and the gradient of every leaf that requires grad.
void compare(const std::string& what, const Fn& fused, const Fn& composite,
             const std::vector<Tensor>& inputs) {
  INFO(what);
  auto run = [&](const Fn& f, std::vector<std::vector<double>>& grads) {
    std::vector<Tensor> leaves;
    for (const auto& t : inputs) leaves.push_back(t.requires_grad() ? leaf(t) : t.detach());
    Tensor y = f(leaves);
    Rng rng(99);
    run_backward({y}, {Tensor::randn(y.shape(), rng, DType::f64)});
    for (const auto& l : leaves)
      grads.push_back(l.requires_grad() ? l.grad().to_doubles() : std::vector<double>());
    return y.to_doubles();
  };
  std::vector<std::vector<double>> g_fused, g_comp;
  auto y_fused = run(fused, g_fused);
  auto y_comp = run(composite, g_comp);
  CHECK(max_rel_error(y_fused, y_comp) <= kComposeTol);
  for (size_t i = 0; i < inputs.size(); i++) {
    INFO("gradient of input " << i);
    CHECK(max_rel_error(g_fused[i], g_comp[i]) <= kComposeTol);
  }
}

} // namespace

TEST_CASE("norm: rms_norm matches its composition", "[unit]") {
  auto x = rnd({3, 4, 16}, 1), w = rnd({16}, 2, 0.2, 1.0);
  compare(
      "rms_norm", [](auto& in) { return rms_norm(in[0], in[1], 1e-6); },
      [](auto& in) { return mul(rms_hat(in[0], 1e-6), in[1]); }, {x, w});
  compare(
      "rms_norm no weight", [](auto& in) { return rms_norm(in[0], Tensor(), 1e-5); },
      [](auto& in) { return rms_hat(in[0], 1e-5); }, {x});
  compare(
      "rms_norm strided x", [](auto& in) { return rms_norm(transpose(in[0], 0, 2), in[1], 1e-6); },
      [](auto& in) { return mul(rms_hat(transpose(in[0], 0, 2), 1e-6), in[1]); },
      {rnd({3, 4, 16}, 3), rnd({3}, 4, 0.2, 1.0)});
}

TEST_CASE("norm: rms_norm_zero_centered matches its composition", "[unit]") {
  auto x = rnd({5, 24}, 5), w = rnd({24}, 6, 0.2);
  compare(
      "rms_norm_zero_centered", [](auto& in) { return rms_norm_zero_centered(in[0], in[1], 1e-6); },
      [](auto& in) { return mul(rms_hat(in[0], 1e-6), affine(in[1], 1.0, 1.0)); }, {x, w});
}

TEST_CASE("norm: rms_norm_gated matches its composition", "[unit]") {
  auto x = rnd({2, 3, 16}, 7), z = rnd({2, 3, 16}, 8, 2.0), w = rnd({16}, 9, 0.2, 1.0);
  compare(
      "rms_norm_gated", [](auto& in) { return rms_norm_gated(in[0], in[1], in[2], 1e-6); },
      [](auto& in) { return mul(mul(rms_hat(in[0], 1e-6), in[2]), silu(in[1])); }, {x, z, w});
  compare(
      "rms_norm_gated no weight",
      [](auto& in) { return rms_norm_gated(in[0], in[1], Tensor(), 1e-5); },
      [](auto& in) { return mul(rms_hat(in[0], 1e-5), silu(in[1])); }, {x, z});
}

TEST_CASE("norm: layer_norm matches its composition", "[unit]") {
  auto x = rnd({4, 3, 20}, 10, 1.0, 0.7), w = rnd({20}, 11, 0.2, 1.0), b = rnd({20}, 12, 0.2);
  compare(
      "layer_norm", [](auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
      [](auto& in) { return layer_norm_composite(in[0], in[1], in[2], 1e-5); }, {x, w, b});
  compare(
      "layer_norm no affine", [](auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-6); },
      [](auto& in) { return layer_norm_composite(in[0], Tensor(), Tensor(), 1e-6); }, {x});
  compare(
      "layer_norm weight only", [](auto& in) { return layer_norm(in[0], in[1], Tensor(), 1e-6); },
      [](auto& in) { return layer_norm_composite(in[0], in[1], Tensor(), 1e-6); }, {x, w});
}

TEST_CASE("norm: bad shapes and dtypes are reported with the shapes", "[unit]") {
  Tensor x = Tensor::zeros({2, 3, 8}), w7 = Tensor::ones({7}), z = Tensor::zeros({2, 3, 7});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(rms_norm(x, w7, 1e-6), Contains("(7)") && Contains("(2, 3, 8)"));
  CHECK_THROWS_WITH(rms_norm(x, Tensor::ones({8}, DType::bf16), 1e-6),
                    Contains("dtype mismatch") && Contains("bf16(8)"));
  CHECK_THROWS_WITH(rms_norm_zero_centered(x, Tensor::ones({2, 8}), 1e-6),
                    Contains("(2, 8)") && Contains("(2, 3, 8)"));
  CHECK_THROWS_WITH(rms_norm_gated(x, z, Tensor(), 1e-6),
                    Contains("z: f32(2, 3, 7)") && Contains("(2, 3, 8)"));
  CHECK_THROWS_WITH(rms_norm_gated(x, Tensor(), Tensor(), 1e-6), Contains("z is an undefined"));
  CHECK_THROWS_WITH(layer_norm(x, Tensor(), w7, 1e-5), Contains("bias: f32(7)"));
  CHECK_THROWS_WITH(layer_norm(Tensor::zeros({4, 0}), Tensor(), Tensor(), 1e-5),
                    Contains("(4, 0)"));
  CHECK_THROWS_WITH(rms_norm(Tensor::zeros({4}, DType::i32), Tensor(), 1e-6), Contains("i32(4)"));
  CHECK_THROWS_WITH(rms_norm(x, Tensor(), -1.0), Contains("eps"));
}

TEST_CASE("norm: records named backward nodes only when needed", "[unit]") {
  Tensor x = rnd({2, 4}, 13), z = rnd({2, 4}, 14), w = rnd({4}, 15);
  CHECK(std::string(rms_norm(x, w, 1e-6).grad_fn()->name()) == "RmsNormBackward");
  CHECK(std::string(rms_norm_zero_centered(x, w, 1e-6).grad_fn()->name()) ==
        "RmsNormZeroCenteredBackward");
  CHECK(std::string(rms_norm_gated(x, z, w, 1e-6).grad_fn()->name()) == "RmsNormGatedBackward");
  CHECK(std::string(layer_norm(x, w, w, 1e-6).grad_fn()->name()) == "LayerNormBackward");
  CHECK_FALSE(rms_norm(x.detach(), w.detach(), 1e-6).grad_fn());
  NoGradGuard no_grad;
  CHECK_FALSE(layer_norm(x, w, w, 1e-6).grad_fn());
}

TEST_CASE("norm: parameter gradients are bit-identical for any thread count", "[unit]") {
  // Large enough for the OpenMP path; the row blocks of the dw/db sums depend only on the shape.
  auto grads_with_threads = [](int threads) {
    int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    Rng rng(16);
    Tensor x = Tensor::randn({1000, 64}, rng), z = Tensor::randn({1000, 64}, rng);
    Tensor w = leaf(Tensor::randn({64}, rng, DType::f32, 0.2, 1.0));
    Tensor b = leaf(Tensor::randn({64}, rng, DType::f32, 0.2));
    Tensor dy = Tensor::randn({1000, 64}, rng);
    run_backward({rms_norm(x, w, 1e-6), rms_norm_gated(x, z, w, 1e-6), layer_norm(x, w, b, 1e-5)},
                 {dy, dy, dy});
    omp_set_num_threads(before);
    std::vector<float> out = w.grad().to_floats(), db = b.grad().to_floats();
    out.insert(out.end(), db.begin(), db.end());
    return out;
  };
  auto one = grads_with_threads(1);
  CHECK(grads_with_threads(3) == one);
  CHECK(grads_with_threads(8) == one);
}
