// kernels/optim.h (cpu::adamw_step for every instantiated (T, G, S), cpu::sum_squares) on raw
// buffers against the AdamW update of Loshchilov & Hutter / torch.optim.AdamW written here in
// double, and a plain double sum of squares.
#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/optim.h"
#include "src/base/dtype.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

constexpr int kSteps = 4;

AdamWStepArgs step_args(int t) {
  AdamWStepArgs a;
  a.lr = 1e-2;
  a.beta1 = 0.9;
  a.beta2 = 0.99;
  a.eps = 1e-8;
  a.weight_decay = 0.1;
  a.step_size = a.lr / (1 - std::pow(a.beta1, t));
  a.bias_correction2_sqrt = std::sqrt(1 - std::pow(a.beta2, t));
  return a;
}

// kSteps AdamW steps in double from p0 with gradients grads[t] (each exactly as the kernel reads
// them); returns the final weights, m and v.
struct AdamState {
  std::vector<double> w, m, v;
};
AdamState adamw_ref(const std::vector<double>& p0, const std::vector<std::vector<double>>& grads) {
  AdamState s{p0, std::vector<double>(p0.size(), 0.0), std::vector<double>(p0.size(), 0.0)};
  for (int t = 1; t <= kSteps; t++) {
    const double b1 = 0.9, b2 = 0.99, lr = 1e-2, wd = 0.1, eps = 1e-8;
    for (size_t i = 0; i < p0.size(); i++) {
      const double g = grads[size_t(t - 1)][i];
      s.w[i] *= 1 - lr * wd;
      s.m[i] = b1 * s.m[i] + (1 - b1) * g;
      s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
      const double m_hat = s.m[i] / (1 - std::pow(b1, t)), v_hat = s.v[i] / (1 - std::pow(b2, t));
      s.w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  return s;
}

// Gradients over several magnitudes, with exact zeros (m = v = 0 for those elements: the update
// must be 0, not 0/0).
template <typename G> std::vector<std::vector<G>> make_grads(Rng& rng, int64_t n) {
  std::vector<std::vector<G>> grads;
  for (int t = 0; t < kSteps; t++) {
    std::vector<G> g;
    for (int64_t i = 0; i < n; i++)
      g.push_back(G(i % 5 == 0 ? 0.0 : rng.uniform(-1, 1) * std::pow(10.0, double(i % 4) - 2)));
    grads.push_back(std::move(g));
  }
  return grads;
}

// Tolerances for fp32 state: a step changes w by at most lr * (1 + ~1/(1 - beta1^t)) ~ 0.1 and
// m / (sqrt(v) + eps) is computed in a few float ops (~1e-6 relative), so after 4 steps w is off
// by ~1e-7 absolute, m and v by a few ulps relative. double state: 1e-13.
template <typename T, typename G> void check_adamw(int64_t n) {
  INFO("n " << n);
  Rng rng(uint64_t(n) + sizeof(T) * 10 + sizeof(G));
  auto param = random_vector<T>(rng, n, -1, 1);
  auto grads = make_grads<G>(rng, n);
  using S = acc_t<T>;
  constexpr bool needs_master = !std::is_same_v<T, S>;
  std::vector<S> master, m(size_t(n), S(0)), v(size_t(n), S(0));
  for (const T& p : param) master.push_back(S(vlm::testing::widen(p)));
  std::vector<std::vector<double>> grads_d;
  for (auto& g : grads) grads_d.push_back(widen_all(g));
  const AdamState ref = adamw_ref(widen_all(param), grads_d);
  for (int t = 1; t <= kSteps; t++)
    cpu::adamw_step<T, G, S>(param.data(), needs_master ? master.data() : nullptr,
                             grads[size_t(t - 1)].data(), m.data(), v.data(), n, step_args(t));
  const bool f64 = std::is_same_v<S, double>;
  check_close(m, ref.m, f64 ? 1e-13 : 1e-5, f64 ? 1e-18 : 1e-12, "exp_avg");
  check_close(v, ref.v, f64 ? 1e-13 : 1e-5, f64 ? 1e-20 : 1e-14, "exp_avg_sq");
  if constexpr (needs_master) {
    check_close(master, ref.w, 0, 1e-6, "master weights");
    // param is the master weight rounded to nearest even bf16.
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; i++) mismatches += param[i].bits != T(float(master[i])).bits;
    CHECK(mismatches == 0);
    // ... and so within a bf16 rounding (2^-8 relative) of the double weights.
    check_close(param, ref.w, 1.0 / 256, 2e-6, "bf16 params");
  } else {
    check_close(param, ref.w, 0, f64 ? 1e-13 : 1e-6, "params");
  }
}

} // namespace

TEST_CASE("optim kernel: adamw_step over 4 steps against double AdamW", "[optim]") {
  for (int64_t n : {1, 7, 33, 1001}) {
    check_adamw<float, float>(n);
    check_adamw<double, double>(n);
    check_adamw<bf16, bf16>(n);
    check_adamw<bf16, float>(n);
  }
}

TEST_CASE("optim kernel: adamw_step by hand: decay only, and a first step of +-lr", "[optim]") {
  // First step with g != 0: m_hat = g, v_hat = g^2, so w -= lr * sign(g) (up to eps/|g|), after
  // the decay w *= 1 - lr * wd.
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -4.0f, 0.0f}, m(3, 0.f), v(3, 0.f);
  AdamWStepArgs a = step_args(1);
  cpu::adamw_step<float, float, float>(p.data(), nullptr, g.data(), m.data(), v.data(), 3, a);
  CHECK(p[0] == Approx(1.0 * 0.999 - 0.01).epsilon(1e-6));
  CHECK(p[1] == Approx(-2.0 * 0.999 + 0.01).epsilon(1e-6));
  CHECK(p[2] == Approx(0.5 * 0.999).epsilon(1e-7)); // g = 0: only the decay
  CHECK(m[1] == Approx(-0.4).epsilon(1e-6));
  CHECK(v[1] == Approx(0.16).epsilon(1e-6));
}

TEST_CASE("optim kernel: sum_squares against a double sum across its 16384-element blocks",
          "[optim]") {
  for (int64_t n : {0, 1, 17, 16384, 16385, 50001}) {
    INFO("n " << n);
    Rng rng(uint64_t(n) + 1);
    auto xf = random_vector<float>(rng, n, -2, 2);
    auto xd = random_vector<double>(rng, n, -2, 2);
    auto xb = random_vector<bf16>(rng, n, -2, 2);
    double sf = 0, sd = 0, sb = 0;
    for (int64_t i = 0; i < n; i++) {
      sf += double(xf[i]) * double(xf[i]);
      sd += xd[i] * xd[i];
      sb += double(float(xb[i])) * double(float(xb[i]));
    }
    // Sums of n <= 50001 non-negative terms in double: relative error < n * 2^-53 < 1e-11.
    CHECK(cpu::sum_squares(xf.data(), n) == Approx(sf).epsilon(1e-11).margin(0));
    CHECK(cpu::sum_squares(xd.data(), n) == Approx(sd).epsilon(1e-11).margin(0));
    CHECK(cpu::sum_squares(xb.data(), n) == Approx(sb).epsilon(1e-11).margin(0));
  }
}
