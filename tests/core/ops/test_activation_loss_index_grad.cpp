// Finite-difference checks (f64) of activations, softmax, cross-entropy, embedding and index ops,
// plus their bad-input errors and edge cases.
#include "tests/gradcheck.h"

#include "src/core/ops/activation.h"
#include "src/core/ops/index.h"
#include "src/core/ops/loss.h"

using namespace vlm;
using vlm::testing::gradcheck;
using vlm::testing::leaf;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0) {
  Rng rng(seed);
  return leaf(Tensor::randn(s, rng, DType::f64, std));
}

Tensor positive(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  return leaf(Tensor::uniform(s, rng, 0.2, 3.0, DType::f64));
}

Tensor i64(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }

} // namespace

TEST_CASE("activation: gradcheck sigmoid, silu, gelu", "[grad]") {
  auto x = rnd({3, 7}, 1, 2.5);
  gradcheck("sigmoid", [](auto& in) { return sigmoid(in[0]); }, {x});
  gradcheck("silu", [](auto& in) { return silu(in[0]); }, {x});
  gradcheck("gelu erf", [](auto& in) { return gelu(in[0], GeluApprox::none); }, {x});
  gradcheck("gelu tanh", [](auto& in) { return gelu(in[0], GeluApprox::tanh); }, {x});
}

TEST_CASE("activation: gradcheck exp, log, rsqrt, square", "[grad]") {
  auto x = rnd({2, 5}, 2), p = positive({2, 5}, 3);
  gradcheck("exp", [](auto& in) { return vlm::exp(in[0]); }, {x});
  gradcheck("square", [](auto& in) { return square(in[0]); }, {x});
  gradcheck("log", [](auto& in) { return vlm::log(in[0]); }, {p});
  gradcheck("rsqrt", [](auto& in) { return rsqrt(in[0]); }, {p});
}

TEST_CASE("activation: gradcheck swiglu (gate and up) and softmax", "[grad]") {
  auto gate = rnd({2, 3, 4}, 4, 2.0), up = rnd({2, 3, 4}, 5);
  gradcheck("swiglu", [](auto& in) { return swiglu(in[0], in[1]); }, {gate, up});
  auto x = rnd({3, 2, 6}, 6, 2.0);
  gradcheck("softmax", [](auto& in) { return softmax(in[0]); }, {x});
  // A non-contiguous input goes through the same kernels.
  gradcheck("softmax of transpose", [](auto& in) { return softmax(transpose(in[0], 1, 2)); }, {x});
}

TEST_CASE("activation: bad inputs name the shapes", "[grad]") {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2});
  CHECK_THROWS_WITH(swiglu(a, b), Catch::Contains("(2, 3)") && Catch::Contains("(3, 2)"));
  CHECK_THROWS_WITH(swiglu(a, Tensor::zeros({2, 3}, DType::f64)), Catch::Contains("(2, 3)"));
  Tensor ints = Tensor::zeros({4, 5}, DType::i64);
  CHECK_THROWS_WITH(silu(ints), Catch::Contains("(4, 5)"));
  CHECK_THROWS_WITH(gelu(ints), Catch::Contains("(4, 5)"));
  CHECK_THROWS_WITH(softmax(ints), Catch::Contains("(4, 5)"));
  CHECK_THROWS_WITH(vlm::exp(ints), Catch::Contains("(4, 5)"));
}

TEST_CASE("loss: gradcheck cross_entropy mean and sum with ignored tokens", "[grad]") {
  auto logits = rnd({5, 7}, 7, 2.0);
  Tensor labels = i64({3, -100, 0, 6, 2}, {5});
  gradcheck("ce mean", [&](auto& in) { return cross_entropy(in[0], labels); }, {logits});
  gradcheck("ce sum", [&](auto& in) { return cross_entropy(in[0], labels, -100, Reduction::sum); },
            {logits});
  Tensor labels32 = Tensor::from_vector<int32_t>({1, 1, 5, -1, 4}, {5});
  gradcheck("ce i32 labels, ignore_index -1",
            [&](auto& in) { return cross_entropy(in[0], labels32, -1); }, {logits});
  // [B, S, V] logits with [B, S] labels.
  auto logits3 = rnd({2, 3, 4}, 8, 2.0);
  Tensor labels2 = i64({0, 3, -100, 2, 1, 1}, {2, 3});
  gradcheck("ce 3-d", [&](auto& in) { return cross_entropy(in[0], labels2); }, {logits3});
}

TEST_CASE("loss: cross_entropy value, count and the fully ignored batch", "[grad]") {
  // Uniform logits: every valid token costs log(V).
  Tensor logits = Tensor::zeros({3, 4}, DType::f32);
  Tensor labels = i64({1, -100, 3}, {3});
  CHECK(cross_entropy(logits, labels).item() == Approx(std::log(4.0)).epsilon(1e-6));
  auto r = cross_entropy_sum(logits, labels);
  CHECK(r.num_valid.item() == 2);
  CHECK(r.loss_sum.item() == Approx(2 * std::log(4.0)).epsilon(1e-6));
  CHECK(r.loss_sum.dtype() == DType::f32);
  CHECK(r.loss_sum.dim() == 0);
  CHECK(cross_entropy(logits.to(DType::bf16), labels).dtype() == DType::f32);
  CHECK(cross_entropy(logits.to(DType::f64), labels).dtype() == DType::f64);

  // All labels ignored: loss 0 and zero gradients (torch would give NaN).
  Tensor x = leaf(Tensor::full({2, 5}, 0.5));
  Tensor loss = cross_entropy(x, i64({-100, -100}, {2}));
  CHECK(loss.item() == 0.0);
  loss.backward();
  for (double v : x.grad().to_doubles()) CHECK(v == 0.0);
}

TEST_CASE("loss: cross_entropy bad inputs", "[grad]") {
  Tensor logits = Tensor::zeros({3, 4});
  CHECK_THROWS_WITH(cross_entropy(logits, i64({1, 4, 0}, {3})),
                    Catch::Contains("label 4 at row 1") && Catch::Contains("(3, 4)"));
  CHECK_THROWS_WITH(cross_entropy(logits, i64({1, 0, -3}, {3})),
                    Catch::Contains("label -3 at row 2"));
  CHECK_THROWS_WITH(cross_entropy(logits, i64({1, 0}, {2})),
                    Catch::Contains("(3, 4)") && Catch::Contains("(2)"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::zeros({3})), Catch::Contains("(3)"));
  CHECK_THROWS_WITH(cross_entropy(Tensor::zeros({3, 4}, DType::i64), i64({0, 0, 0}, {3})),
                    Catch::Contains("(3, 4)"));
}

TEST_CASE("index: gradcheck embedding with repeated ids", "[grad]") {
  auto weight = rnd({6, 3}, 9);
  Tensor ids = i64({5, 0, 5, 2, 5, 0}, {2, 3});
  gradcheck("embedding", [&](auto& in) { return embedding(in[0], ids); }, {weight});
  Tensor ids32 = Tensor::from_vector<int32_t>({1, 1, 4}, {3});
  gradcheck("embedding i32", [&](auto& in) { return embedding(in[0], ids32); }, {weight});
}

TEST_CASE("index: gradcheck index_select and index_add", "[grad]") {
  auto x = rnd({3, 4, 2}, 10);
  Tensor idx = i64({3, 1, 3, 0, 1}, {5});
  for (int64_t dim : {0, 1, 2, -1}) {
    Tensor index = dim == 0 ? i64({2, 0, 2}, {3}) : dim == 1 ? idx : i64({1, 1, 0}, {3});
    gradcheck("index_select dim " + std::to_string(dim),
              [&](auto& in) { return index_select(in[0], dim, index); }, {x});
  }
  auto src = rnd({3, 5, 2}, 11);
  gradcheck("index_add", [&](auto& in) { return index_add(in[0], 1, idx, in[1]); }, {x, src});
  gradcheck("scatter_add", [&](auto& in) { return scatter_add(in[0], 1, idx, in[1]); }, {x, src});
}

TEST_CASE("index: values, determinism and bad inputs", "[grad]") {
  // index_add sums repeated rows.
  Tensor x = Tensor::zeros({3, 2});
  Tensor src = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor out = index_add(x, 0, i64({2, 0, 2}, {3}), src);
  CHECK(out.to_doubles() == std::vector<double>{3, 4, 0, 0, 6, 8});
  CHECK(x.to_doubles() == std::vector<double>(6, 0.0)); // out of place

  // The embedding gradient is bit-identical across runs (no atomics).
  Rng rng(12);
  Tensor w = leaf(Tensor::randn({50, 64}, rng));
  std::vector<int64_t> many(4096);
  for (size_t i = 0; i < many.size(); i++) many[i] = int64_t((i * 7919) % 13);
  Tensor ids = i64(many, {64, 64});
  Tensor g = Tensor::randn({64, 64, 64}, rng);
  std::vector<double> first;
  for (int run = 0; run < 3; run++) {
    w.zero_grad();
    run_backward({embedding(w, ids)}, {g});
    if (run == 0)
      first = w.grad().to_doubles();
    else
      CHECK(w.grad().to_doubles() == first);
  }

  Tensor table = Tensor::zeros({10, 4});
  CHECK_THROWS_WITH(embedding(table, i64({1, 2, 3, 10, 4, 5}, {2, 3})),
                    Catch::Contains("position (1, 0) is 10") && Catch::Contains("(10, 4)"));
  CHECK_THROWS_WITH(embedding(table, i64({-1}, {1})), Catch::Contains("is -1"));
  CHECK_THROWS_WITH(embedding(table, Tensor::zeros({3})), Catch::Contains("(3)"));
  CHECK_THROWS_WITH(embedding(Tensor::zeros({10}), i64({1}, {1})), Catch::Contains("(10)"));
  Tensor y = Tensor::zeros({3, 4, 2});
  CHECK_THROWS_WITH(index_select(y, 1, i64({0, 4}, {2})),
                    Catch::Contains("position (1) is 4") && Catch::Contains("(3, 4, 2)"));
  CHECK_THROWS_WITH(index_select(y, 1, i64({0, 1}, {1, 2})), Catch::Contains("(1, 2)"));
  CHECK_THROWS_WITH(index_select(y, 3, i64({0}, {1})), Catch::Contains("index_select"));
  CHECK_THROWS_WITH(index_add(y, 1, i64({0, 1}, {2}), Tensor::zeros({3, 3, 2})),
                    Catch::Contains("(3, 2, 2)") && Catch::Contains("(3, 3, 2)"));
  CHECK_THROWS_WITH(index_add(y, 1, i64({0, 9}, {2}), Tensor::zeros({3, 2, 2})),
                    Catch::Contains("is 9") && Catch::Contains("(3, 4, 2)"));
}
