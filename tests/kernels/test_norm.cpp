// kernels/norm.h (cpu::rms_norm_*, rms_norm_gated_*, layer_norm_*) on raw buffers against plain
// double-precision loops written here from the textbook formulas (backward: the analytic
// derivative of the forward, derived independently of the kernel's factoring).
#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/norm.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

// (rows, dim): one element; a single row shorter and longer than the kernels' 16 reduction lanes;
// odd sizes; a long row; more rows than the 128 row blocks of the parameter-gradient sums (so a
// block holds several rows).
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},  {1, 7},    {1, 37}, {3, 17},
                                                          {5, 33}, {2, 1001}, {131, 6}};

// Tolerances, float32 kernels against double: inputs are O(1) and every output is a short chain
// of float ops after a row reduction of at most ~1000 terms kept in 16 lanes, so the error stays
// a few hundred float ulps at worst (~1e-5 relative); atol covers outputs that cancel to ~0.
// double kernels: the same chains in double, 1e-12.
template <typename T> double rtol() { return std::is_same_v<T, double> ? 1e-12 : 2e-5; }
template <typename T> double atol() { return std::is_same_v<T, double> ? 1e-12 : 2e-5; }

double silu(double z) { return z / (1 + std::exp(-z)); }
double dsilu(double z) {
  const double s = 1 / (1 + std::exp(-z));
  return s + z * s * (1 - s);
}

// gain[j] of an RMSNorm: 1 (none), w (scale), 1 + w (offset).
double gain(RmsNormWeight mode, const std::vector<double>& w, int64_t j) {
  switch (mode) {
  case RmsNormWeight::none: return 1;
  case RmsNormWeight::scale: return w[j];
  case RmsNormWeight::offset: return 1 + w[j];
  }
  return 0;
}

template <typename T> void check_rms_norm(RmsNormWeight mode, int64_t rows, int64_t dim) {
  using A = acc_t<T>;
  INFO("rows " << rows << " dim " << dim << " mode " << int(mode));
  Rng rng(uint64_t(rows * 1000 + dim));
  const double eps = 1e-6;
  auto x = random_vector<T>(rng, rows * dim, -2, 2);
  auto w = random_vector<T>(rng, dim, 0.5, 1.5);
  auto dy = random_vector<T>(rng, rows * dim, -1, 1);
  const auto xd = widen_all(x), wd = widen_all(w), dyd = widen_all(dy);
  const T* wp = mode == RmsNormWeight::none ? nullptr : w.data();

  std::vector<T> y(rows * dim);
  std::vector<A> rstd(rows);
  cpu::rms_norm_fwd<T>(y.data(), rstd.data(), x.data(), wp, mode, rows, dim, eps);
  std::vector<T> dx(rows * dim), dw(dim);
  cpu::rms_norm_bwd<T>(dx.data(), wp ? dw.data() : nullptr, dy.data(), x.data(), wp, rstd.data(),
                       mode, rows, dim);
  // dx alone (no dw) must give the same dx.
  std::vector<T> dx_only(rows * dim);
  cpu::rms_norm_bwd<T>(dx_only.data(), nullptr, dy.data(), x.data(), wp, rstd.data(), mode, rows,
                       dim);

  // y_j = g_j x_j r with r = (mean x^2 + eps)^-1/2, dr/dx_k = -r^3 x_k / dim, so
  // dx_k = r g_k dy_k - r^3 x_k / dim * sum_j dy_j g_j x_j and dw_j = sum_rows dy_j x_j r.
  std::vector<double> y_ref(rows * dim), r_ref(rows), dx_ref(rows * dim), dw_ref(size_t(dim), 0.0);
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < dim; j++) ss += xd[r * dim + j] * xd[r * dim + j];
    const double rs = 1 / std::sqrt(ss / double(dim) + eps);
    r_ref[r] = rs;
    for (int64_t j = 0; j < dim; j++) {
      y_ref[r * dim + j] = gain(mode, wd, j) * xd[r * dim + j] * rs;
      dot += dyd[r * dim + j] * gain(mode, wd, j) * xd[r * dim + j];
      dw_ref[j] += dyd[r * dim + j] * xd[r * dim + j] * rs;
    }
    for (int64_t j = 0; j < dim; j++)
      dx_ref[r * dim + j] = rs * gain(mode, wd, j) * dyd[r * dim + j] -
                            rs * rs * rs * xd[r * dim + j] / double(dim) * dot;
  }
  check_close(rstd, r_ref, rtol<T>(), 0, "rstd");
  check_close(y, y_ref, rtol<T>(), atol<T>(), "y");
  check_close(dx, dx_ref, rtol<T>(), atol<T>(), "dx");
  check_close(dx_only, dx_ref, rtol<T>(), atol<T>(), "dx without dw");
  // dw sums `rows` terms of size ~1: scale the absolute tolerance with them.
  if (wp) check_close(dw, dw_ref, rtol<T>(), atol<T>() * double(rows), "dw");
}

} // namespace

TEST_CASE("norm kernel: rms_norm_fwd/bwd (none, scale, offset) against a double loop", "[norm]") {
  for (auto mode : {RmsNormWeight::none, RmsNormWeight::scale, RmsNormWeight::offset})
    for (auto [rows, dim] : kShapes) {
      check_rms_norm<float>(mode, rows, dim);
      check_rms_norm<double>(mode, rows, dim);
    }
}

TEST_CASE("norm kernel: rms_norm_fwd bf16 within two bf16 roundings of the double result",
          "[norm]") {
  const int64_t rows = 3, dim = 37;
  Rng rng(5);
  auto x = random_vector<bf16>(rng, rows * dim, -2, 2);
  auto w = random_vector<bf16>(rng, dim, 0.5, 1.5);
  const auto xd = widen_all(x), wd = widen_all(w);
  for (auto mode : {RmsNormWeight::none, RmsNormWeight::scale, RmsNormWeight::offset}) {
    INFO("mode " << int(mode));
    std::vector<bf16> y(rows * dim);
    std::vector<float> rstd(rows);
    cpu::rms_norm_fwd<bf16>(y.data(), rstd.data(), x.data(),
                            mode == RmsNormWeight::none ? nullptr : w.data(), mode, rows, dim,
                            1e-6);
    std::vector<double> y_ref(rows * dim);
    for (int64_t r = 0; r < rows; r++) {
      double ss = 0;
      for (int64_t j = 0; j < dim; j++) ss += xd[r * dim + j] * xd[r * dim + j];
      const double rs = 1 / std::sqrt(ss / double(dim) + 1e-6);
      for (int64_t j = 0; j < dim; j++)
        y_ref[r * dim + j] = gain(mode, wd, j) * xd[r * dim + j] * rs;
    }
    // scale mode rounds x̂ to bf16 and then the product (unit roundoff 2^-8 each), the other
    // modes round once: 2^-7 relative bounds both, plus float arithmetic's ~1e-6.
    check_close(y, y_ref, 1.0 / 128 + 1e-6, 1e-6, "y bf16");
  }
}

TEST_CASE("norm kernel: rms_norm_gated_fwd/bwd with and without weight", "[norm]") {
  for (bool with_w : {true, false})
    for (auto [rows, dim] : kShapes) {
      INFO("rows " << rows << " dim " << dim << " weight " << with_w);
      Rng rng(uint64_t(rows * 7 + dim));
      const double eps = 1e-5;
      auto x = random_vector<float>(rng, rows * dim, -2, 2);
      auto z = random_vector<float>(rng, rows * dim, -4, 4);
      auto w = random_vector<float>(rng, dim, 0.5, 1.5);
      auto dy = random_vector<float>(rng, rows * dim, -1, 1);
      const auto xd = widen_all(x), zd = widen_all(z), wd = widen_all(w), dyd = widen_all(dy);
      const float* wp = with_w ? w.data() : nullptr;
      std::vector<float> y(rows * dim), rstd(rows);
      cpu::rms_norm_gated_fwd<float>(y.data(), rstd.data(), x.data(), z.data(), wp, rows, dim, eps);
      std::vector<float> dx(rows * dim), dz(rows * dim), dw(dim);
      cpu::rms_norm_gated_bwd<float>(dx.data(), dz.data(), with_w ? dw.data() : nullptr, dy.data(),
                                     x.data(), z.data(), wp, rstd.data(), rows, dim);

      // y = n silu(z), n = g x r; dn = dy silu(z); dz = dy n silu'(z); dw = sum dn x r;
      // dx as the plain RMSNorm with upstream dn (dx_k = r g_k dn_k - r^3 x_k / dim sum dn g x).
      std::vector<double> y_ref(y.size()), dx_ref(y.size()), dz_ref(y.size()), dw_ref(dim);
      for (int64_t r = 0; r < rows; r++) {
        double ss = 0, dot = 0;
        for (int64_t j = 0; j < dim; j++) ss += xd[r * dim + j] * xd[r * dim + j];
        const double rs = 1 / std::sqrt(ss / double(dim) + eps);
        for (int64_t j = 0; j < dim; j++) {
          const int64_t i = r * dim + j;
          const double g = with_w ? wd[j] : 1.0, n = g * xd[i] * rs, dn = dyd[i] * silu(zd[i]);
          y_ref[i] = n * silu(zd[i]);
          dz_ref[i] = dyd[i] * n * dsilu(zd[i]);
          dw_ref[j] += dn * xd[i] * rs;
          dot += dn * g * xd[i];
        }
        for (int64_t j = 0; j < dim; j++) {
          const int64_t i = r * dim + j;
          const double g = with_w ? wd[j] : 1.0;
          dx_ref[i] = rs * g * dyd[i] * silu(zd[i]) - rs * rs * rs * xd[i] / double(dim) * dot;
        }
      }
      // float32 tolerances as in check_rms_norm (silu adds a few ulps: exp to ~2e-7).
      check_close(y, y_ref, 2e-5, 2e-5, "y");
      check_close(dz, dz_ref, 2e-5, 2e-5, "dz");
      check_close(dx, dx_ref, 2e-5, 2e-5, "dx");
      if (with_w) check_close(dw, dw_ref, 2e-5, 2e-5 * double(rows), "dw");
    }
}

TEST_CASE("norm kernel: layer_norm_fwd/bwd with and without weight and bias", "[norm]") {
  for (bool affine : {true, false})
    for (auto [rows, dim] : kShapes) {
      INFO("rows " << rows << " dim " << dim << " affine " << affine);
      Rng rng(uint64_t(rows * 13 + dim));
      const double eps = 1e-5;
      // An offset of 3: the mean is not ~0, so a one-pass variance would lose digits.
      auto x = random_vector<double>(rng, rows * dim, 1, 5);
      auto w = random_vector<double>(rng, dim, 0.5, 1.5);
      auto b = random_vector<double>(rng, dim, -1, 1);
      auto dy = random_vector<double>(rng, rows * dim, -1, 1);
      std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(b.begin(), b.end()),
          dyf(dy.begin(), dy.end());
      const auto xd = widen_all(xf), wd = widen_all(wf), bd = widen_all(bf), dyd = widen_all(dyf);
      std::vector<float> y(xf.size()), mean(rows), rstd(rows);
      cpu::layer_norm_fwd<float>(y.data(), mean.data(), rstd.data(), xf.data(),
                                 affine ? wf.data() : nullptr, affine ? bf.data() : nullptr, rows,
                                 dim, eps);
      std::vector<float> dx(xf.size()), dw(dim), db(dim);
      cpu::layer_norm_bwd<float>(dx.data(), affine ? dw.data() : nullptr,
                                 affine ? db.data() : nullptr, dyf.data(), xf.data(),
                                 affine ? wf.data() : nullptr, mean.data(), rstd.data(), rows, dim);

      // y = (x - mu) r w + b; with a = dy w and x̂ = (x - mu) r,
      // dx = r (a - mean(a) - x̂ mean(a x̂)) (d mu and d r through the mean and biased variance).
      std::vector<double> y_ref(xf.size()), dx_ref(xf.size()), mu_ref(rows), r_ref(rows),
          dw_ref(dim), db_ref(dim);
      for (int64_t r = 0; r < rows; r++) {
        double mu = 0, var = 0, sa = 0, sax = 0;
        for (int64_t j = 0; j < dim; j++) mu += xd[r * dim + j];
        mu /= double(dim);
        for (int64_t j = 0; j < dim; j++) var += (xd[r * dim + j] - mu) * (xd[r * dim + j] - mu);
        const double rs = 1 / std::sqrt(var / double(dim) + eps);
        mu_ref[r] = mu;
        r_ref[r] = rs;
        for (int64_t j = 0; j < dim; j++) {
          const int64_t i = r * dim + j;
          const double xh = (xd[i] - mu) * rs, a = dyd[i] * (affine ? wd[j] : 1.0);
          y_ref[i] = affine ? xh * wd[j] + bd[j] : xh;
          dw_ref[j] += dyd[i] * xh;
          db_ref[j] += dyd[i];
          sa += a;
          sax += a * xh;
        }
        for (int64_t j = 0; j < dim; j++) {
          const int64_t i = r * dim + j;
          const double xh = (xd[i] - mu) * rs, a = dyd[i] * (affine ? wd[j] : 1.0);
          dx_ref[i] = rs * (a - sa / double(dim) - xh * sax / double(dim));
        }
      }
      check_close(mean, mu_ref, 2e-5, 0, "mean");
      // rstd of a single element is eps^-1/2 (variance 0); the float mean's rounding error
      // then shows as a variance of ~1e-13, far below eps.
      check_close(rstd, r_ref, 2e-5, 0, "rstd");
      check_close(y, y_ref, 2e-5, 2e-5, "y");
      // dim 1: x̂ = 0 and dx = r (a - a - 0) = 0 up to rounding of a; with r = eps^-1/2 ~ 316.
      check_close(dx, dx_ref, 2e-5, 2e-5, "dx");
      if (affine) {
        check_close(dw, dw_ref, 2e-5, 2e-5 * double(rows), "dw");
        check_close(db, db_ref, 2e-5, 2e-5 * double(rows), "db");
      }
    }
}
