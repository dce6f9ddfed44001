#include <catch2/catch.hpp>

#include <cmath>

#include "src/core/ops.h"
#include "src/optim/adamw.h"

using namespace vlm;
using namespace vlm::optim;
using Catch::Matchers::Contains;

namespace {

Tensor named_param(const std::vector<double>& v, const std::string& name,
                   DType dtype = DType::f64) {
  Tensor p = Tensor::from_doubles(v, {int64_t(v.size())}, dtype);
  p.set_requires_grad(true).set_name(name);
  return p;
}

// The textbook AdamW step (Loshchilov & Hutter, decoupled decay; torch's documented algorithm),
// written independently of the kernel's operation order.
struct ReferenceAdamW {
  double lr, beta1, beta2, eps, wd;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    t++;
    for (size_t i = 0; i < p.size(); i++) {
      p[i] -= lr * wd * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

void check_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) CHECK(std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i])));
}

} // namespace

TEST_CASE("adamw: steps match the textbook formula in f64", "[optim]") {
  const std::vector<double> p0 = {1.0, -2.0, 0.5, 3e-3};
  const std::vector<std::vector<double>> grads = {
      {0.1, -0.3, 2.0, 1e-9}, {-0.2, 0.1, 1.5, -2e-9}, {0.0, 0.4, -1.0, 0.0}};
  Tensor p = named_param(p0, "w");
  AdamW opt({{"all", {p}, /*lr_scale=*/1.0, /*weight_decay=*/0.1}}, {0.9, 0.999, 1e-8});
  ReferenceAdamW ref{
      0.02, 0.9, 0.999, 1e-8, 0.1, p0, std::vector<double>(4), std::vector<double>(4)};
  for (const auto& g : grads) {
    p.set_grad(Tensor::from_doubles(g, {4}, DType::f64));
    opt.step(0.02);
    ref.step(g);
    check_close(p.to_doubles(), ref.p, 1e-13);
    check_close(opt.state("w").exp_avg.to_doubles(), ref.m, 1e-13);
    check_close(opt.state("w").exp_avg_sq.to_doubles(), ref.v, 1e-13);
  }
  CHECK(opt.state("w").step == 3);
  CHECK(opt.state("w").exp_avg.dtype() == DType::f64);
  CHECK_FALSE(opt.state("w").master.defined());
}

TEST_CASE("adamw: groups apply their own LR scale and weight decay", "[optim]") {
  // A zero gradient leaves m = v = 0, so the update is pure decoupled decay: p *= 1 - lr*wd.
  Tensor a = named_param({2.0, -4.0}, "a"), b = named_param({2.0, -4.0}, "b"),
         c = named_param({2.0, -4.0}, "c");
  AdamW opt({{"decay", {a}, 1.0, 0.1}, {"scaled", {b}, 0.5, 0.1}, {"no_decay", {c}, 1.0, 0.0}});
  for (auto* t : {&a, &b, &c}) t->set_grad(Tensor::zeros({2}, DType::f64));
  opt.step(0.1);
  CHECK(a.to_doubles() == std::vector<double>{2.0 * 0.99, -4.0 * 0.99});
  CHECK(b.to_doubles() == std::vector<double>{2.0 * 0.995, -4.0 * 0.995});
  CHECK(c.to_doubles() == std::vector<double>{2.0, -4.0});
  CHECK(opt.param_names() == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("adamw: a parameter without a gradient is skipped", "[optim]") {
  Tensor a = named_param({1.0, 2.0}, "a"), b = named_param({1.0, 2.0}, "b");
  AdamW opt({{"g", {a, b}, 1.0, 0.1}});
  a.set_grad(Tensor::from_doubles({1, 1}, {2}, DType::f64));
  opt.step(0.1);
  CHECK(opt.state("a").step == 1);
  CHECK(opt.state("b").step == 0);
  CHECK(b.to_doubles() == std::vector<double>{1.0, 2.0}); // not even decayed
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("adamw: a bf16 parameter follows the f32 run through its fp32 master", "[optim]") {
  // Initial values are bf16-representable, gradients f32: the master must equal the f32
  // parameter bit for bit, and the bf16 parameter must be the master rounded to nearest-even.
  Rng rng(11);
  Tensor init = Tensor::randn({300}, rng, DType::f32).to(DType::bf16).to(DType::f32);
  Tensor p32 = init.clone().set_requires_grad(true).set_name("p");
  Tensor p16 = init.to(DType::bf16).set_requires_grad(true).set_name("p");
  AdamW opt32({{"g", {p32}, 1.0, 0.05}}), opt16({{"g", {p16}, 1.0, 0.05}});
  CHECK(opt16.state("p").master.to_doubles() == init.to_doubles());
  for (int s = 0; s < 5; s++) {
    Tensor g = Tensor::randn({300}, rng, DType::f32);
    p32.set_grad(g);
    p16.set_grad(g);
    opt32.step(1e-2);
    opt16.step(1e-2);
  }
  const auto& st = opt16.state("p");
  REQUIRE(st.master.dtype() == DType::f32);
  CHECK(st.exp_avg.dtype() == DType::f32);
  CHECK(st.master.to_doubles() == p32.to_doubles());
  CHECK(p16.to_doubles() == p32.to(DType::bf16).to_doubles());
  // The bf16 parameter changed although most updates (~1e-2) are below its ulp near 1.
  CHECK(p16.to_doubles() != init.to_doubles());
}

TEST_CASE("adamw: refresh_master copies parameter values into the masters", "[optim]") {
  Tensor p = named_param({1.0, 2.0}, "p", DType::bf16);
  AdamW opt({{"g", {p}, 1.0, 0.0}});
  {
    NoGradGuard no_grad;
    fill_(p, 3.0); // e.g. weights loaded after the optimizer was built
  }
  CHECK(opt.state("p").master.to_doubles() == std::vector<double>{1.0, 2.0});
  opt.refresh_master();
  CHECK(opt.state("p").master.to_doubles() == std::vector<double>{3.0, 3.0});
}

TEST_CASE("adamw: large tensors (parallel kernel) match the small-tensor path", "[optim]") {
  // Element-wise kernel: the OpenMP split cannot change any element.
  Rng rng(2);
  const int64_t n = 100000;
  Tensor big = Tensor::randn({n}, rng).set_requires_grad(true).set_name("big");
  Tensor g = Tensor::randn({n}, rng);
  Tensor small =
      slice(big.detach(), 0, n - 7, n).contiguous().set_requires_grad(true).set_name("small");
  AdamW opt({{"g", {big, small}, 1.0, 0.1}});
  big.set_grad(g);
  small.set_grad(slice(g, 0, n - 7, n).contiguous());
  opt.step(1e-3);
  CHECK(slice(big.detach(), 0, n - 7, n).to_doubles() == small.to_doubles());
}

TEST_CASE("adamw: state is keyed by parameter name", "[optim]") {
  Tensor w = Tensor::zeros({2, 3}).set_requires_grad(true).set_name("model.w");
  AdamW opt({{"g", {w}, 1.0, 0.0}});
  CHECK(opt.has_state("model.w"));
  CHECK_FALSE(opt.has_state("w"));
  CHECK(opt.state("model.w").exp_avg.shape() == Shape{2, 3});
  CHECK_THROWS_WITH(opt.state("w"), Contains("no state for parameter 'w'"));
}

TEST_CASE("adamw: bad parameters and gradients are clear errors", "[optim]") {
  Tensor unnamed = Tensor::zeros({2}).set_requires_grad(true);
  CHECK_THROWS_WITH(AdamW({{"g", {unnamed}, 1.0, 0.0}}), Contains("no name") && Contains("(2)"));
  Tensor w = Tensor::zeros({2, 3}).set_requires_grad(true).set_name("w");
  CHECK_THROWS_WITH(AdamW({{"a", {w}, 1.0, 0.0}, {"b", {w}, 1.0, 0.0}}),
                    Contains("'w' appears twice"));
  Tensor frozen = Tensor::zeros({4, 2}).set_name("frozen");
  CHECK_THROWS_WITH(AdamW({{"g", {frozen}, 1.0, 0.0}}), Contains("frozen") && Contains("(4, 2)"));
  Tensor ints = Tensor::zeros({3}, DType::i32).set_name("ints");
  CHECK_THROWS_WITH(AdamW({{"g", {ints}, 1.0, 0.0}}), Contains("i32(3)"));
  CHECK_THROWS_WITH(AdamW({{"g", {w}, 1.0, -0.1}}), Contains("weight_decay"));
  CHECK_THROWS_WITH(AdamW({{"g", {w}, 1.0, 0.0}}, {1.0, 0.999, 1e-8}), Contains("betas"));

  AdamW opt({{"g", {w}, 1.0, 0.0}});
  w.set_grad(Tensor::zeros({2, 3}, DType::f64));
  CHECK_THROWS_WITH(opt.step(1e-3),
                    Contains("must be f32") && Contains("f64(2, 3)") && Contains("f32(2, 3)"));
  w.set_grad(Tensor::zeros({2, 3}));
  CHECK_THROWS_WITH(opt.step(-1.0), Contains("lr must be"));
  CHECK_THROWS_WITH(opt.step(std::nan("")), Contains("lr must be"));
}
