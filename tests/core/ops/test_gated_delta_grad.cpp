// Finite-difference checks (f64) of the ops of Qwen3.5's Gated DeltaNet layer: causal_conv1d
// (packed documents, with and without SiLU), gated_delta_rule (packed documents with boundaries
// inside a chunk, a 1-token document and one longer than a 64-token chunk; HV = 2·HK, dk != dv)
// fed like the model: q and k through l2_normalize, beta = sigmoid(b), g = -softplus(a), so those
// ops are checked in the composition too; and softplus and l2_normalize alone.
// (rms_norm_gated, the layer's output norm, is checked in test_norm_grad.cpp.)
#include <cmath>
#include <vector>

#include "src/core/ops.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::gradcheck;
using vlm::testing::leaf;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0, double mean = 0.0) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64, std, mean));
}

Tensor uniform(const Shape& s, uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  return leaf(Tensor::uniform(s, rng, lo, hi, DType::f64));
}

Tensor constant(const Tensor& t) { return t.detach(); }

// Document boundaries {0, l0, l0 + l1, ...} as the i32 CPU tensor the ops take.
Tensor offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return Tensor::from_vector(cu, {int64_t(cu.size())});
}

} // namespace

TEST_CASE("gated delta: grad causal_conv1d over packed documents", "[grad]") {
  // A 1-token document, ones shorter than K, an empty one.
  const Tensor cu = offsets({1, 2, 0, 5, 3, 6});
  const int64_t T = 17, C = 3;
  auto x = rnd({T, C}, 1), w4 = rnd({C, 4}, 2, 0.5), w2 = rnd({C, 2}, 3, 0.5);
  for (bool silu : {true, false}) {
    INFO("silu " << silu);
    auto f = [&](auto& in) { return causal_conv1d(in[0], in[1], cu, silu); };
    gradcheck("causal_conv1d K=4", f, {x, w4});
    gradcheck("causal_conv1d K=2", f, {x, w2});
  }
  gradcheck("causal_conv1d x only", [&](auto& in) { return causal_conv1d(in[0], in[1], cu, true); },
            {x, constant(w4)});
  gradcheck("causal_conv1d weight only",
            [&](auto& in) { return causal_conv1d(in[0], in[1], cu, true); }, {constant(x), w4});
  // A strided x (the transpose of a [C, T] tensor).
  gradcheck("causal_conv1d strided x",
            [&](auto& in) { return causal_conv1d(transpose(in[0], 0, 1), in[1], cu, true); },
            {rnd({C, T}, 4), w4});
}

TEST_CASE("gated delta: grad gated_delta_rule through l2_normalize, sigmoid and softplus",
          "[grad]") {
  // Boundaries at 5, 6 and 72 (inside the first 64-token chunk of the packed row), a 1-token
  // document, and a 66-token one that spans two chunks of its own.
  const std::vector<int32_t> lengths = {5, 1, 66, 3};
  const Tensor cu = offsets(lengths);
  const int64_t T = 75, HK = 1, HV = 2, dk = 3, dv = 4;
  const double scale = 1.0 / std::sqrt(double(dk));
  // a in (-2.5, 2.5): g = -softplus(a) in (-2.6, -0.08); beta = sigmoid(b) in (0.12, 0.88).
  auto q = rnd({T, HK, dk}, 11), k = rnd({T, HK, dk}, 12), v = rnd({T, HV, dv}, 13);
  auto a = uniform({T, HV}, 14, -2.5, 2.5), b = uniform({T, HV}, 15, -2, 2);
  auto layer = [&](auto& in) {
    Tensor qn = l2_normalize(in[0], 1e-6), kn = l2_normalize(in[1], 1e-6);
    Tensor g = neg(softplus(in[3])), beta = sigmoid(in[4]);
    return gated_delta_rule(qn, kn, in[2], g, beta, cu, scale);
  };
  gradcheck("gated_delta_rule (model inputs)", layer, {q, k, v, a, b});
  gradcheck("gated_delta_rule v and g only", layer, {constant(q), constant(k), v, a, constant(b)});
}

TEST_CASE("gated delta: grad gated_delta_rule direct, no head sharing, strong decay", "[grad]") {
  // The op alone on its own inputs (HV = HK, several heads), g down to -3 and beta near 0 and 1.
  const Tensor cu = offsets({1, 9, 4});
  const int64_t T = 14, H = 2, dk = 4, dv = 2;
  Tensor q, k;
  {
    NoGradGuard no_grad;
    q = leaf(l2_normalize(rnd({T, H, dk}, 21), 1e-6));
    k = leaf(l2_normalize(rnd({T, H, dk}, 22), 1e-6));
  }
  auto v = rnd({T, H, dv}, 23), g = uniform({T, H}, 24, -3, 0), beta = uniform({T, H}, 25, 0, 1);
  gradcheck("gated_delta_rule",
            [&](auto& in) { return gated_delta_rule(in[0], in[1], in[2], in[3], in[4], cu, 0.7); },
            {q, k, v, g, beta});
}

TEST_CASE("gated delta: grad softplus", "[grad]") {
  // Both sides of 0, large negative, and above the threshold 20 (linear there).
  auto x = rnd({3, 7}, 31, 3.0);
  gradcheck("softplus", [](auto& in) { return softplus(in[0]); }, {x});
  Tensor extremes = leaf(Tensor::from_doubles({-30, -5, 0, 5, 19.5, 21, 40}, {7}, DType::f64));
  gradcheck("softplus extremes", [](auto& in) { return softplus(in[0]); }, {extremes});
}

TEST_CASE("gated delta: grad l2_normalize", "[grad]") {
  gradcheck("l2_normalize", [](auto& in) { return l2_normalize(in[0], 1e-6); },
            {rnd({2, 3, 5}, 41)});
  // Rows of small norm, where eps matters (Σx² ~ eps).
  gradcheck("l2_normalize small rows", [](auto& in) { return l2_normalize(in[0], 1e-2); },
            {rnd({4, 3}, 42, 0.05)});
  gradcheck("l2_normalize strided",
            [](auto& in) { return l2_normalize(transpose(in[0], 0, 1), 1e-6); }, {rnd({4, 3}, 43)});
}
