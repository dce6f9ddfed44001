// The deferred skip of a non-finite training step on the CPU: AdamW::step with a skip flag and
// undo_step (src/optim/adamw.h), the step guard that computes the flag and the clip coefficient
// (kernels/optim.h cpu::step_guard), and scale_grads with a coefficient tensor
// (src/optim/grad_clip.h). Their CUDA twins are in tests/optim/test_adamw_skip_gpu.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/optim.h"
#include "src/base/rng.h"
#include "src/core/ops.h"
#include "src/optim/adamw.h"
#include "src/optim/grad_clip.h"

using namespace vlm;
using namespace vlm::optim;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.contiguous(), hb = b.contiguous();
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// Parameters of every dtype AdamW takes (a bf16 one with an f32 and one with a bf16 gradient, so
// the master path runs), in two groups; "idle" never gets a gradient.
struct Setup {
  std::vector<Tensor> params;
  std::unique_ptr<AdamW> opt;
};

Setup make_setup() {
  Rng rng(3);
  Setup s;
  const std::vector<std::pair<const char*, DType>> specs = {{"f32", DType::f32},
                                                            {"f64", DType::f64},
                                                            {"bf16", DType::bf16},
                                                            {"bf16b", DType::bf16},
                                                            {"idle", DType::f32}};
  ParamGroup decay{"decay", {}, 1.0, 0.1}, other{"other", {}, 0.5, 0.0};
  for (size_t k = 0; k < specs.size(); k++) {
    Tensor p = Tensor::randn({40000}, rng, specs[k].second); // > 32768: the parallel CPU kernel
    p.set_requires_grad(true).set_name(specs[k].first);
    s.params.push_back(p);
    (k % 2 == 0 ? decay : other).params.push_back(p);
  }
  s.opt =
      std::make_unique<AdamW>(std::vector<ParamGroup>{decay, other}, AdamWOptions{0.9, 0.95, 1e-8});
  return s;
}

// Gradients for step `step` (the same in every setup): bf16b's in bf16, the rest in their own.
void set_grads(Setup& s, int step) {
  Rng rng(100 + uint64_t(step));
  for (auto& p : s.params) {
    if (p.name() == "idle") continue;
    const DType g = p.dtype() == DType::bf16 && p.name() == "bf16" ? DType::f32 : p.dtype();
    p.set_grad(Tensor::randn(p.shape(), rng, g, 0.1));
  }
}

struct Snapshot {
  std::vector<Tensor> values, exp_avg, exp_avg_sq, master;
  std::vector<int64_t> steps;
};

Snapshot snapshot(const Setup& s) {
  Snapshot r;
  for (const auto& p : s.params) {
    const AdamWState& st = s.opt->state(p.name());
    r.values.push_back(p.detach().clone());
    r.exp_avg.push_back(st.exp_avg.clone());
    r.exp_avg_sq.push_back(st.exp_avg_sq.clone());
    r.master.push_back(st.master.defined() ? st.master.clone() : Tensor());
    r.steps.push_back(st.step);
  }
  return r;
}

void check_same(const Snapshot& a, const Snapshot& b) {
  REQUIRE(a.values.size() == b.values.size());
  for (size_t k = 0; k < a.values.size(); k++) {
    INFO("parameter " << k);
    CHECK(same_bits(a.values[k], b.values[k]));
    CHECK(same_bits(a.exp_avg[k], b.exp_avg[k]));
    CHECK(same_bits(a.exp_avg_sq[k], b.exp_avg_sq[k]));
    CHECK(a.master[k].defined() == b.master[k].defined());
    if (a.master[k].defined()) CHECK(same_bits(a.master[k], b.master[k]));
    CHECK(a.steps[k] == b.steps[k]);
  }
}

Tensor flag(double v) { return Tensor::from_vector(std::vector<double>{v}, {1}); }

} // namespace

TEST_CASE("adamw skip: a nonzero flag changes nothing, undo_step returns the step counts, the "
          "next step equals a run without the skipped one",
          "[optim]") {
  Setup a = make_setup(), b = make_setup();
  // Both: one applied step (with a zero flag in a, none in b: the same update).
  set_grads(a, 0);
  set_grads(b, 0);
  a.opt->step(1e-2, flag(0.0));
  b.opt->step(1e-2);
  check_same(snapshot(a), snapshot(b));

  // a: a skipped step with other gradients.
  const Snapshot before = snapshot(a);
  set_grads(a, 1);
  a.opt->step(1e-2, flag(1.0));
  Snapshot counted = before;
  for (size_t k = 0; k < counted.steps.size(); k++)
    if (a.params[k].name() != "idle") counted.steps[k]++; // advanced, nothing else
  check_same(snapshot(a), counted);
  a.opt->undo_step();
  check_same(snapshot(a), before);
  a.opt->undo_step(); // twice: nothing more
  check_same(snapshot(a), before);

  // Then the same step in both: t = 2 in both, the same bits everywhere.
  set_grads(a, 2);
  set_grads(b, 2);
  a.opt->step(2e-2, flag(0.0));
  b.opt->step(2e-2);
  check_same(snapshot(a), snapshot(b));
  CHECK(a.opt->state("f32").step == 2);
  CHECK(a.opt->state("idle").step == 0);
}

TEST_CASE("adamw skip: NaN and Inf flags skip too, the flag must be one f64 value", "[optim]") {
  for (double v : {std::numeric_limits<double>::quiet_NaN(), double(INFINITY), -1.0}) {
    Setup a = make_setup();
    set_grads(a, 0);
    const Snapshot before = snapshot(a);
    a.opt->step(1e-2, flag(v));
    a.opt->undo_step();
    check_same(snapshot(a), before);
  }
  Setup a = make_setup();
  set_grads(a, 0);
  CHECK_THROWS(a.opt->step(1e-2, Tensor::zeros({2}, DType::f64)));
  CHECK_THROWS(a.opt->step(1e-2, Tensor::zeros({1}, DType::f32)));
}

TEST_CASE("step guard: clip coefficient as clip_coefficient, skip flag from the loss sum and norm",
          "[optim]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = INFINITY;
  struct Case {
    std::vector<double> losses;
    double norm_sq, max_norm;
    bool skip;
  };
  const std::vector<Case> cases = {
      {{1.5, 2.5}, 16.0, 1.0, false},      // clipped: 1 / (4 + 1e-6)
      {{1.5}, 0.25, 1.0, false},           // not clipped: 1
      {{1.5, 2.5, 3.0}, 16.0, 0.0, false}, // max_norm 0: no clipping
      {{1.5, nan}, 16.0, 1.0, true},       // a NaN loss: skip, the coefficient still computed
      {{inf, 1.0}, 16.0, 1.0, true},       // an infinite loss
      {{1.0}, inf, 1.0, true},             // an infinite norm: coefficient 1
      {{1.0}, nan, 1.0, true},             // a NaN norm
      {{1e308, 1e308}, 4.0, 1.0, true},    // finite losses whose sum overflows (as on the host)
      {{inf, -inf}, 4.0, 1.0, true},       // a NaN sum
      {{}, 4.0, 1.0, false},               // no micro-batch value
  };
  for (const Case& c : cases) {
    const int64_t m = int64_t(c.losses.size());
    std::vector<double> s = c.losses;
    s.push_back(c.norm_sq);
    s.push_back(-7); // overwritten
    s.push_back(-7);
    kernels::cpu::step_guard(s.data(), m, c.max_norm);
    INFO("norm² " << c.norm_sq << ", max_norm " << c.max_norm << ", " << m << " losses");
    CHECK((s[size_t(m)] == c.norm_sq || std::isnan(c.norm_sq))); // the input stays
    const bool clips = c.max_norm > 0 && std::isfinite(c.norm_sq);
    const double want_coef = clips ? clip_coefficient(std::sqrt(c.norm_sq), c.max_norm) : 1.0;
    CHECK(s[size_t(m) + 1] == want_coef);
    CHECK(s[size_t(m) + 2] == (c.skip ? 1.0 : 0.0));
  }
}

TEST_CASE("scale_grads with a coefficient tensor: scales below 1, leaves 1 and NaN alone",
          "[optim]") {
  auto params = [] {
    Tensor a = Tensor::zeros({2}).set_requires_grad(true);
    a.set_grad(Tensor::from_doubles({3, 4}, {2}));
    Tensor b = Tensor::zeros({1}, DType::bf16).set_requires_grad(true);
    b.set_grad(Tensor::from_doubles({12}, {1}, DType::bf16));
    return std::vector<Tensor>{a, b, Tensor::zeros({5}).set_requires_grad(true)};
  };
  std::vector<Tensor> got = params(), want = params();
  scale_grads(got, flag(0.25));
  scale_grads(want, 0.25);
  for (size_t i = 0; i < 2; i++) CHECK(same_bits(got[i].grad(), want[i].grad()));
  CHECK_FALSE(got[2].grad().defined());
  for (double c : {1.0, 2.0, std::numeric_limits<double>::quiet_NaN()}) {
    std::vector<Tensor> ps = params();
    scale_grads(ps, flag(c));
    CHECK(ps[0].grad().to_doubles() == std::vector<double>{3, 4});
    CHECK(ps[1].grad().to_doubles() == std::vector<double>{12});
  }
  CHECK_THROWS(scale_grads(got, Tensor::zeros({2}, DType::f64)));
}
