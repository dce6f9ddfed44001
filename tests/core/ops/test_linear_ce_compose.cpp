// The fused LM head + cross-entropy (linear_cross_entropy, chunked over the vocabulary) against
// cross_entropy(linear(x, w)): loss, dx and dweight, for chunk sizes that divide the vocabulary,
// do not, are 1 and exceed it, with ignored rows, i32/i64 labels, mean and sum.
// Tolerances (relative, max-norm): f64 1e-12; f32 1e-5 (chunked logsumexp and fp32 dx
// accumulation in another order); bf16 1e-2 (each logit and gradient is rounded to bf16 once in
// both versions; a one-ulp flip is allowed).
#include "tests/gradcheck.h"

#include <cmath>

#include "src/core/ops/loss.h"
#include "src/core/ops/matmul.h"
#include "tests/error_of.h"

using namespace vlm;
using vlm::testing::leaf;
using vlm::testing::max_rel_error;

namespace {

struct Result {
  double loss;
  Tensor dx, dw;
};

Result run(bool fused, const Tensor& x, const Tensor& w, const Tensor& labels, Reduction red,
           int64_t chunk) {
  Tensor xl = leaf(x), wl = leaf(w);
  Tensor loss = fused ? linear_cross_entropy(xl, wl, labels, -100, red, chunk)
                      : cross_entropy(linear(xl, wl), labels, -100, red);
  loss.backward(Tensor::full({}, 0.7, loss.dtype()));
  return {loss.item(), xl.grad(), wl.grad()};
}

void compare(DType dt, DType label_dt, int64_t n, int64_t h, int64_t v, int64_t chunk,
             Reduction red, uint64_t seed) {
  INFO(dtype_name(dt) << " labels " << dtype_name(label_dt) << " N " << n << " H " << h << " V "
                      << v << " chunk " << chunk << " sum " << (red == Reduction::sum));
  Rng rng(seed);
  Tensor x = Tensor::randn({n, h}, rng, dt);
  Tensor w = Tensor::randn({v, h}, rng, dt, 0.3);
  std::vector<int64_t> l(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; r++) l[size_t(r)] = r % 5 == 2 ? -100 : rng.randint(0, v);
  Tensor labels = Tensor::from_vector(l, {n}).to(label_dt);
  Result a = run(true, x, w, labels, red, chunk), b = run(false, x, w, labels, red, chunk);
  const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 1e-2;
  CHECK(std::abs(a.loss - b.loss) <= tol * std::abs(b.loss));
  CHECK(max_rel_error(a.dx.to_doubles(), b.dx.to_doubles()) <= tol);
  CHECK(max_rel_error(a.dw.to_doubles(), b.dw.to_doubles()) <= tol);
}

} // namespace

TEST_CASE("linear_cross_entropy matches cross_entropy(linear(x, w)) for any vocabulary chunk",
          "[compose]") {
  uint64_t seed = 1;
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(100), int64_t(250), int64_t(4096)})
      compare(dt, DType::i64, 37, 24, 250, chunk, Reduction::mean, seed++);
    compare(dt, DType::i32, 64, 40, 1000, 96, Reduction::sum, seed++);
    compare(dt, DType::i32, 1, 8, 3, 2, Reduction::mean, seed++);
  }
}

TEST_CASE("linear_cross_entropy: all rows ignored, bad labels and shapes", "[compose]") {
  Rng rng(5);
  Tensor x = leaf(Tensor::randn({3, 4}, rng)), w = leaf(Tensor::randn({6, 4}, rng));
  Tensor ignored = Tensor::full({3}, -100, DType::i64);
  Tensor loss = linear_cross_entropy(x, w, ignored);
  CHECK(loss.item() == 0.0);
  loss.backward();
  CHECK(x.grad().to_doubles() == std::vector<double>(12, 0.0));
  CHECK(w.grad().to_doubles() == std::vector<double>(24, 0.0));

  Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 6, 1}, {3});
  CHECK_THAT(testing::error_of([&] { linear_cross_entropy(x, w, bad); }),
             Catch::Contains("label 6 at row 1"));
  CHECK_THAT(testing::error_of([&] {
               linear_cross_entropy(x, Tensor::randn({6, 5}, rng), bad);
             }),
             Catch::Contains("[V, H]"));
  CHECK_THAT(
      testing::error_of([&] { linear_cross_entropy(x, w, ignored, -100, Reduction::mean, 0); }),
      Catch::Contains("vocab_chunk"));
}
