#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <omp.h>

#include "src/core/ops.h"
#include "src/optim/grad_clip.h"

using namespace vlm;
using namespace vlm::optim;
using Catch::Matchers::Contains;

namespace {

Tensor param_with_grad(const std::vector<double>& g, DType dtype = DType::f32) {
  Tensor p = Tensor::zeros({int64_t(g.size())}, dtype).set_requires_grad(true);
  p.set_grad(Tensor::from_doubles(g, {int64_t(g.size())}, dtype));
  return p;
}

} // namespace

TEST_CASE("grad clip: global norm over all gradients, scaled when above max_norm", "[optim]") {
  // sqrt(9 + 16 + 144) = 13.
  std::vector<Tensor> ps = {param_with_grad({3, 4}), param_with_grad({12}),
                            Tensor::zeros({5}).set_requires_grad(true)}; // no grad: skipped
  CHECK(grad_norm(ps) == 13.0);
  CHECK(clip_grad_norm(ps, 26.0) == 13.0);
  CHECK(ps[0].grad().to_doubles() == std::vector<double>{3, 4}); // below max_norm: untouched
  CHECK(clip_grad_norm(ps, 6.5) == 13.0);                        // returns the pre-clip norm
  const double coef = 6.5 / (13.0 + 1e-6);
  CHECK(ps[0].grad().to_doubles()[1] == Approx(4 * coef).epsilon(1e-7));
  CHECK(ps[1].grad().to_doubles()[0] == Approx(12 * coef).epsilon(1e-7));
  CHECK(grad_norm(ps) == Approx(6.5).epsilon(1e-6));
  CHECK_FALSE(ps[2].grad().defined());
}

TEST_CASE("grad clip: clip_coefficient follows torch", "[optim]") {
  CHECK(clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(clip_coefficient(1.0, 1.0) == 1.0 / (1.0 + 1e-6)); // the 1e-6 makes it just below 1
  CHECK(clip_coefficient(1.0 - 1e-5, 1.0) == 1.0);         // clamped
  CHECK(clip_coefficient(4.0, 1.0) == 1.0 / (4.0 + 1e-6));
  CHECK_THROWS_WITH(clip_coefficient(1.0, 0.0), Contains("max_norm must be > 0"));
  CHECK_THROWS_WITH(clip_grad_norm({}, -1.0), Contains("max_norm must be > 0"));
}

TEST_CASE("grad clip: a non-finite norm is returned and nothing is scaled", "[optim]") {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Tensor> nan_ps = {param_with_grad({3, std::nan("")}), param_with_grad({100})};
  CHECK(std::isnan(clip_grad_norm(nan_ps, 1.0)));
  CHECK(nan_ps[1].grad().to_doubles() == std::vector<double>{100});
  std::vector<Tensor> inf_ps = {param_with_grad({inf}), param_with_grad({100})};
  CHECK(std::isinf(clip_grad_norm(inf_ps, 1.0)));
  CHECK(inf_ps[1].grad().to_doubles() == std::vector<double>{100});
}

TEST_CASE("grad clip: bf16 and f64 gradients", "[optim]") {
  std::vector<Tensor> ps = {param_with_grad({3, 4}, DType::bf16),
                            param_with_grad({12}, DType::f64)};
  CHECK(clip_grad_norm(ps, 1.3) == 13.0);
  CHECK(ps[0].grad().dtype() == DType::bf16);
  const double coef = 1.3 / (13.0 + 1e-6);
  CHECK(ps[0].grad().to_doubles()[0] == Approx(3 * coef).epsilon(4e-3)); // bf16 rounding
  CHECK(ps[1].grad().to_doubles()[0] == Approx(12 * coef).epsilon(1e-12));
}

TEST_CASE("grad clip: the norm is bit-identical for any thread count", "[optim]") {
  Rng rng(4);
  std::vector<Tensor> ps;
  for (int64_t n : {1000, 200000, 70001}) {
    Tensor p = Tensor::zeros({n}).set_requires_grad(true);
    p.set_grad(Tensor::randn({n}, rng));
    ps.push_back(p);
  }
  const double many = grad_norm_squared(ps);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = grad_norm_squared(ps);
  omp_set_num_threads(threads);
  CHECK(one == many);
  CHECK(grad_norm_squared(ps) == many);
  double naive = 0;
  for (const auto& p : ps)
    for (double v : p.grad().to_doubles()) naive += v * v;
  CHECK(many == Approx(naive).epsilon(1e-12));
}
