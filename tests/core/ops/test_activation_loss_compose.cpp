// Fused activation, softmax, cross-entropy and index ops against their compositions from primitive
// ops, forward and input gradients, in f64 (max-norm relative error <= 1e-12).
#include "tests/gradcheck.h"

#include <cmath>

#include "src/core/ops/activation.h"
#include "src/core/ops/index.h"
#include "src/core/ops/loss.h"

using namespace vlm;
using vlm::testing::GradFn;
using vlm::testing::leaf;
using vlm::testing::max_rel_error;

namespace {

constexpr double kTol = 1e-12;

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0) {
  Rng rng(seed);
  return Tensor::randn(s, rng, DType::f64, std);
}

Tensor i64(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// [n, classes] one-hot rows of `ids` (all-zero rows where skip(id)), as an f64 constant.
Tensor one_hot(const std::vector<int64_t>& ids, int64_t classes, int64_t skip = INT64_MIN) {
  std::vector<double> v(ids.size() * size_t(classes), 0.0);
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] != skip) v[i * size_t(classes) + size_t(ids[i])] = 1.0;
  return Tensor::from_doubles(v, {int64_t(ids.size()), classes}, DType::f64);
}

// Runs both functions on fresh leaves of the same inputs, backpropagates the same random upstream
// gradient through each, and compares outputs and input gradients.
void compare(const std::string& name, const GradFn& fused, const GradFn& composed,
             const std::vector<Tensor>& inputs) {
  INFO(name);
  std::vector<Tensor> a, b;
  for (const auto& t : inputs) {
    a.push_back(leaf(t));
    b.push_back(leaf(t));
  }
  Tensor out_a = fused(a), out_b = composed(b);
  REQUIRE(out_a.shape() == out_b.shape());
  CHECK(max_rel_error(out_a.to_doubles(), out_b.to_doubles()) <= kTol);
  Rng rng(99);
  Tensor upstream = Tensor::randn(out_a.shape(), rng, DType::f64);
  run_backward({out_a}, {upstream});
  run_backward({out_b}, {upstream});
  for (size_t i = 0; i < inputs.size(); i++) {
    INFO("gradient of input " << i);
    REQUIRE(a[i].grad().defined());
    REQUIRE(b[i].grad().defined());
    CHECK(max_rel_error(a[i].grad().to_doubles(), b[i].grad().to_doubles()) <= kTol);
  }
}

} // namespace

TEST_CASE("activation: swiglu, silu, sigmoid vs compositions", "[compose]") {
  Tensor gate = rnd({3, 4, 5}, 1, 2.5), up = rnd({3, 4, 5}, 2);
  compare(
      "swiglu = silu(gate) * up", [](auto& in) { return swiglu(in[0], in[1]); },
      [](auto& in) { return mul(silu(in[0]), in[1]); }, {gate, up});
  compare(
      "silu = x * sigmoid(x)", [](auto& in) { return silu(in[0]); },
      [](auto& in) { return mul(in[0], sigmoid(in[0])); }, {gate});
  compare(
      "sigmoid = 1 / (1 + exp(-x))", [](auto& in) { return sigmoid(in[0]); },
      [](auto& in) {
        return div(Tensor::ones({1}, DType::f64), affine(vlm::exp(neg(in[0])), 1.0, 1.0));
      },
      {gate});
}

TEST_CASE("activation: gelu(tanh), rsqrt, square vs compositions", "[compose]") {
  Tensor x = rnd({4, 6}, 3, 2.0);
  // 0.5 x (1 + tanh(z)) = x * sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3).
  const double beta = std::sqrt(2.0 / M_PI);
  compare(
      "gelu tanh", [](auto& in) { return gelu(in[0], GeluApprox::tanh); },
      [&](auto& in) {
        Tensor cube = mul(square(in[0]), in[0]);
        Tensor z = affine(add(in[0], scale(cube, 0.044715)), 2 * beta);
        return mul(in[0], sigmoid(z));
      },
      {x});
  compare(
      "square = x * x", [](auto& in) { return square(in[0]); },
      [](auto& in) { return mul(in[0], in[0]); }, {x});
  Rng rng(4);
  Tensor p = Tensor::uniform({4, 6}, rng, 0.2, 5.0, DType::f64);
  compare(
      "rsqrt = exp(-0.5 log x)", [](auto& in) { return rsqrt(in[0]); },
      [](auto& in) { return vlm::exp(scale(vlm::log(in[0]), -0.5)); }, {p});
}

TEST_CASE("activation: softmax vs exp / sum(exp)", "[compose]") {
  Tensor x = rnd({2, 3, 7}, 5, 2.0);
  compare(
      "softmax", [](auto& in) { return softmax(in[0]); },
      [](auto& in) {
        Tensor e = vlm::exp(in[0]);
        return div(e, sum(e, {-1}, true));
      },
      {x});
}

TEST_CASE("loss: cross_entropy vs log-softmax composition", "[compose]") {
  const int64_t n = 6, v = 9;
  std::vector<int64_t> labels = {4, -100, 0, 8, 3, -100};
  Tensor label_t = i64(labels, {n});
  Tensor logits = rnd({n, v}, 6, 2.0);
  auto log_softmax = [](const Tensor& x) { return sub(x, vlm::log(sum(vlm::exp(x), {1}, true))); };
  // Gather the label logits with a one-hot mask.
  Tensor mask = one_hot(labels, v, -100);
  compare(
      "mean, one-hot gather", [&](auto& in) { return cross_entropy(in[0], label_t); },
      [&](auto& in) { return scale(sum(mul(log_softmax(in[0]), mask)), -1.0 / 4); }, {logits});
  compare(
      "sum, one-hot gather",
      [&](auto& in) { return cross_entropy(in[0], label_t, -100, Reduction::sum); },
      [&](auto& in) { return neg(sum(mul(log_softmax(in[0]), mask))); }, {logits});
  // Gather with index_select on the flattened log-probabilities.
  std::vector<int64_t> flat_pos;
  for (int64_t i = 0; i < n; i++)
    if (labels[size_t(i)] != -100) flat_pos.push_back(i * v + labels[size_t(i)]);
  Tensor pos = i64(flat_pos, {int64_t(flat_pos.size())});
  compare(
      "mean, index_select gather", [&](auto& in) { return cross_entropy(in[0], label_t); },
      [&](auto& in) {
        return neg(mean(index_select(reshape(log_softmax(in[0]), {n * v}), 0, pos)));
      },
      {logits});
}

TEST_CASE("index: embedding, index_select, index_add vs one-hot matmuls", "[compose]") {
  std::vector<int64_t> ids = {3, 1, 3, 0, 6, 3};
  Tensor weight = rnd({7, 5}, 7);
  Tensor oh = one_hot(ids, 7); // [6, 7]
  compare(
      "embedding = one_hot(ids) @ weight",
      [&](auto& in) {
        return embedding(in[0], i64(ids, {2, 3}));
      },
      [&](auto& in) {
        return reshape(matmul(oh, in[0]), {2, 3, 5});
      },
      {weight});
  compare(
      "index_select(dim 0) = one_hot @ x",
      [&](auto& in) { return index_select(in[0], 0, i64(ids, {6})); },
      [&](auto& in) { return matmul(oh, in[0]); }, {weight});
  Tensor src = rnd({6, 5}, 8);
  compare(
      "index_add(dim 0) = x + one_hot^T @ src",
      [&](auto& in) { return index_add(in[0], 0, i64(ids, {6}), in[1]); },
      [&](auto& in) { return add(in[0], matmul(transpose(oh, 0, 1), in[1])); }, {weight, src});
  // Along a middle dim: move it last, multiply, move it back.
  Tensor x3 = rnd({2, 7, 3}, 9), src3 = rnd({2, 6, 3}, 10);
  compare(
      "index_add(dim 1)", [&](auto& in) { return index_add(in[0], 1, i64(ids, {6}), in[1]); },
      [&](auto& in) {
        Tensor moved = matmul(transpose(in[1], 1, 2), oh); // [2, 3, 7]
        return add(in[0], transpose(moved, 1, 2));
      },
      {x3, src3});
}
