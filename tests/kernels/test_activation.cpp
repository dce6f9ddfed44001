// kernels/activation.h (cpu::unary_fwd/bwd for every UnaryOp, swiglu_fwd/bwd, softmax_fwd/bwd) on
// raw buffers against plain double-precision formulas written here (derivatives by hand).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/activation.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

constexpr double kPi = 3.14159265358979323846;

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

double f_ref(UnaryOp op, double x) {
  switch (op) {
  case UnaryOp::sigmoid: return sigmoid(x);
  case UnaryOp::silu: return x * sigmoid(x);
  case UnaryOp::gelu_erf: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  case UnaryOp::gelu_tanh:
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
  case UnaryOp::exp: return std::exp(x);
  case UnaryOp::log: return std::log(x);
  case UnaryOp::rsqrt: return 1 / std::sqrt(x);
  case UnaryOp::square: return x * x;
  case UnaryOp::softplus: return x > 20 ? x : std::log1p(std::exp(x)); // torch's threshold 20
  }
  return 0;
}

double df_ref(UnaryOp op, double x) {
  switch (op) {
  case UnaryOp::sigmoid: return sigmoid(x) * (1 - sigmoid(x));
  case UnaryOp::silu: return sigmoid(x) + x * sigmoid(x) * (1 - sigmoid(x));
  case UnaryOp::gelu_erf:
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * kPi);
  case UnaryOp::gelu_tanh: {
    const double k = std::sqrt(2 / kPi), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
  }
  case UnaryOp::exp: return std::exp(x);
  case UnaryOp::log: return 1 / x;
  case UnaryOp::rsqrt: return -0.5 * std::pow(x, -1.5);
  case UnaryOp::square: return 2 * x;
  case UnaryOp::softplus: return x > 20 ? 1 : sigmoid(x);
  }
  return 0;
}

// Inputs: the domain of log and rsqrt is (0, inf); exp stays below float overflow.
std::pair<double, double> input_range(UnaryOp op) {
  switch (op) {
  case UnaryOp::log:
  case UnaryOp::rsqrt: return {0.01, 50};
  case UnaryOp::exp: return {-20, 20};
  case UnaryOp::softplus: return {-25, 25}; // both sides of the linear branch at 20
  default: return {-12, 12};
  }
}

// Tolerances, float32 kernel against double: each value is a few float ops and one libm or fast
// exp call (~2e-7 relative), so ~1e-6 relative; atol 1e-6 covers values that are small
// differences of O(1) terms (gelu's 1 + erf(x) for x << 0, the tail of silu'). double: libm
// against libm through differently ordered formulas, 1e-13 relative.
template <typename T> void check_unary(UnaryOp op, int64_t n) {
  INFO(unary_op_name(op) << " n " << n);
  Rng rng(uint64_t(n) * 8 + uint64_t(op));
  auto [lo, hi] = input_range(op);
  auto x = random_vector<T>(rng, n, lo, hi);
  // The extremes and 0 where they are in the domain: the stable sigmoid must not overflow.
  if (lo < 0 && n >= 3) {
    x[0] = T(hi);
    x[1] = T(lo);
    x[2] = T(0.0);
  }
  auto dy = random_vector<T>(rng, n, -1, 1);
  const auto xd = widen_all(x), dyd = widen_all(dy);
  std::vector<T> y(n), dx(n);
  cpu::unary_fwd<T>(op, y.data(), x.data(), n);
  cpu::unary_bwd<T>(op, dx.data(), dy.data(), x.data(), n);
  std::vector<double> y_ref(n), dx_ref(n);
  for (int64_t i = 0; i < n; i++) {
    y_ref[i] = f_ref(op, xd[i]);
    dx_ref[i] = dyd[i] * df_ref(op, xd[i]);
  }
  const bool f64 = std::is_same_v<T, double>;
  check_close(y, y_ref, f64 ? 1e-13 : 2e-6, f64 ? 1e-15 : 1e-6, "fwd");
  check_close(dx, dx_ref, f64 ? 1e-13 : 2e-6, f64 ? 1e-15 : 1e-6, "bwd");
  // In place (out aliases x) gives the same values.
  std::vector<T> inplace = x;
  cpu::unary_fwd<T>(op, inplace.data(), inplace.data(), n);
  check_close(inplace, y_ref, f64 ? 1e-13 : 2e-6, f64 ? 1e-15 : 1e-6, "fwd in place");
}

} // namespace

TEST_CASE("activation kernel: unary_fwd/bwd of every op against double formulas", "[activation]") {
  using enum UnaryOp;
  for (UnaryOp op : {sigmoid, silu, gelu_erf, gelu_tanh, exp, log, rsqrt, square, softplus})
    for (int64_t n : {1, 3, 17, 1003}) {
      check_unary<float>(op, n);
      check_unary<double>(op, n);
    }
}

TEST_CASE("activation kernel: swiglu_fwd/bwd against silu(gate) * up", "[activation]") {
  for (int64_t n : {1, 15, 33, 2049}) {
    INFO("n " << n);
    Rng rng(n);
    auto gate = random_vector<float>(rng, n, -10, 10);
    auto up = random_vector<float>(rng, n, -3, 3);
    auto dy = random_vector<float>(rng, n, -1, 1);
    const auto g = widen_all(gate), u = widen_all(up), d = widen_all(dy);
    std::vector<float> out(n), dgate(n), dup(n), dup_only(n);
    cpu::swiglu_fwd<float>(out.data(), gate.data(), up.data(), n);
    cpu::swiglu_bwd<float>(dgate.data(), dup.data(), dy.data(), gate.data(), up.data(), n);
    cpu::swiglu_bwd<float>(nullptr, dup_only.data(), dy.data(), gate.data(), up.data(), n);
    std::vector<double> out_ref(n), dgate_ref(n), dup_ref(n);
    for (int64_t i = 0; i < n; i++) {
      const double s = sigmoid(g[i]);
      out_ref[i] = g[i] * s * u[i];
      dgate_ref[i] = d[i] * u[i] * (s + g[i] * s * (1 - s));
      dup_ref[i] = d[i] * g[i] * s;
    }
    // As unary (values up to ~30 here, so atol 1e-6 is relative to O(1) terms).
    check_close(out, out_ref, 2e-6, 1e-6, "out");
    check_close(dgate, dgate_ref, 2e-6, 1e-6, "dgate");
    check_close(dup, dup_ref, 2e-6, 1e-6, "dup");
    check_close(dup_only, dup_ref, 2e-6, 1e-6, "dup without dgate");
  }
}

TEST_CASE("activation kernel: softmax_fwd/bwd over rows against a double loop", "[activation]") {
  // (rows, cols): one element; a single row; odd shapes; a long row.
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 19}, {3, 7}, {5, 33}, {2, 3001}}) {
    INFO("rows " << rows << " cols " << cols);
    Rng rng(uint64_t(rows * 10 + cols));
    auto x = random_vector<float>(rng, rows * cols, -6, 6);
    // Row 0 shifted by 80: exp(86) overflows float without the max subtraction.
    for (int64_t c = 0; c < cols; c++) x[c] += 80;
    auto dy = random_vector<float>(rng, rows * cols, -1, 1);
    const auto xd = widen_all(x), dyd = widen_all(dy);
    std::vector<float> y(x.size()), dx(x.size());
    cpu::softmax_fwd<float>(y.data(), x.data(), rows, cols);
    // The backward from the reference softmax (as float), so its check does not lean on fwd.
    std::vector<double> y_ref(x.size()), dx_ref(x.size());
    for (int64_t r = 0; r < rows; r++) {
      double mx = -1e300, sum = 0;
      for (int64_t c = 0; c < cols; c++) mx = std::max(mx, xd[r * cols + c]);
      for (int64_t c = 0; c < cols; c++) sum += std::exp(xd[r * cols + c] - mx);
      for (int64_t c = 0; c < cols; c++)
        y_ref[r * cols + c] = std::exp(xd[r * cols + c] - mx) / sum;
    }
    std::vector<float> yf(y_ref.begin(), y_ref.end());
    const auto yfd = widen_all(yf);
    cpu::softmax_bwd<float>(dx.data(), dy.data(), yf.data(), rows, cols);
    for (int64_t r = 0; r < rows; r++) {
      double dot = 0;
      for (int64_t c = 0; c < cols; c++) dot += dyd[r * cols + c] * yfd[r * cols + c];
      for (int64_t c = 0; c < cols; c++)
        dx_ref[r * cols + c] = yfd[r * cols + c] * (dyd[r * cols + c] - dot);
    }
    // Sums of up to 3001 positive terms in float: ~3001 * 2^-24 < 2e-4 relative worst case,
    // ~1e-6 typical; softmax values are <= 1, so 1e-5 relative plus 1e-9 absolute.
    check_close(y, y_ref, 1e-5, 1e-9, "softmax");
    double row_sum = 0;
    for (int64_t c = 0; c < cols; c++) row_sum += double(y[c]);
    CHECK(row_sum == Approx(1.0).epsilon(1e-5));
    // dx = y (dy - <dy, y>): the dot carries the sum's error, |dy| <= 1.
    check_close(dx, dx_ref, 1e-5, 1e-8, "softmax bwd");
  }
}
