// Finite-difference gradient checks in double. The scalar objective is sum(f(inputs) * R) with a
// fixed random R, so every output element's gradient path is exercised. Analytic gradients come
// from our autograd; numeric ones from central differences on each input element.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "src/core/ops.h"

namespace vlm::testing {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
  uint64_t seed = 1234;
};

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs must be f64 leaves; those with requires_grad are checked. Returns true on success and
// reports the worst element through Catch2 INFO/CHECK.
inline void gradcheck(const std::string& name, const GradFn& f, std::vector<Tensor> inputs,
                      GradcheckOptions opt = {}) {
  INFO("gradcheck " << name);
  for (auto& t : inputs)
    REQUIRE((!t.defined() || !is_floating(t.dtype()) || t.dtype() == DType::f64));
  Rng rng(opt.seed);
  Tensor probe;
  {
    NoGradGuard no_grad;
    Tensor out = f(inputs);
    probe = Tensor::randn(out.shape(), rng, DType::f64);
  }
  auto objective = [&](const std::vector<Tensor>& in) {
    Tensor out = f(in);
    REQUIRE(out.shape() == probe.shape());
    return sum(mul(out, probe));
  };
  for (auto& t : inputs)
    if (t.defined() && t.requires_grad()) t.zero_grad();
  Tensor loss = objective(inputs);
  loss.backward();

  for (size_t i = 0; i < inputs.size(); i++) {
    Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    INFO("input " << i << " " << x.desc());
    REQUIRE(x.grad().defined());
    std::vector<double> analytic = x.grad().to_doubles();
    double* data = x.data<double>();
    double worst = 0;
    int64_t worst_at = -1;
    double worst_a = 0, worst_n = 0;
    for (int64_t k = 0; k < x.numel(); k++) {
      double orig = data[k];
      double fp, fm;
      {
        NoGradGuard no_grad;
        data[k] = orig + opt.eps;
        fp = objective(inputs).item();
        data[k] = orig - opt.eps;
        fm = objective(inputs).item();
        data[k] = orig;
      }
      double numeric = (fp - fm) / (2 * opt.eps);
      double err = std::abs(numeric - analytic[k]) / (opt.atol + opt.rtol * std::abs(numeric));
      if (err > worst) {
        worst = err;
        worst_at = k;
        worst_a = analytic[k];
        worst_n = numeric;
      }
    }
    INFO("worst element " << worst_at << ": analytic " << worst_a << " numeric " << worst_n);
    CHECK(worst <= 1.0);
  }
}

// Max relative error |a-b| / max(|b|_inf, tiny) over all elements, for comparisons with references.
inline double max_rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double ref = 0, diff = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      // A NaN would vanish in std::max: only the same non-finite value on both sides agrees.
      if ((std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i]) continue;
      return INFINITY;
    }
    ref = std::max(ref, std::abs(b[i]));
    diff = std::max(diff, std::abs(a[i] - b[i]));
  }
  return diff / std::max(ref, 1e-30);
}

inline Tensor leaf(const Tensor& t) {
  Tensor l = t.detach();
  l.set_requires_grad(true);
  return l;
}

} // namespace vlm::testing
