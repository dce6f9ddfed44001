// kernels/conv1d.h (cpu::causal_conv1d_fwd/bwd) on raw buffers against plain double-precision
// loops written here: the forward as its definition, the backward as the analytic derivative in
// scatter form (each output's taps push their gradient to the inputs they read), which is not the
// kernel's gather form. Packed documents reset the history (a 1-token document, documents shorter
// than K, an empty one), K = 4 and K = 2, with and without SiLU, float / double / bf16, and results
// bit-identical for any thread count.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/conv1d.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

double sigmoid(double u) { return 1 / (1 + std::exp(-u)); }

// Document boundaries from lengths: {0, l0, l0 + l1, ...}.
std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

struct Reference {
  std::vector<double> y, dx, dw;
};

// y = act(u), u[t, c] = Σ_i w[c, i] x[t - (K-1) + i, c] over taps inside t's document;
// du = dy · act'(u); dx[τ] += w[c, i] du[t] and dw[c, i] += du[t] x[τ] for each tap τ of t.
Reference reference(const std::vector<double>& x, const std::vector<double>& w,
                    const std::vector<double>& dy, const std::vector<int32_t>& cu, int64_t C,
                    int64_t K, bool silu) {
  const int64_t T = cu.back();
  Reference r{std::vector<double>(size_t(T * C)), std::vector<double>(size_t(T * C), 0.0),
              std::vector<double>(size_t(C * K), 0.0)};
  for (size_t b = 0; b + 1 < cu.size(); b++)
    for (int64_t t = cu[b]; t < cu[b + 1]; t++)
      for (int64_t c = 0; c < C; c++) {
        double u = 0;
        for (int64_t i = 0; i < K; i++) {
          const int64_t tau = t - (K - 1) + i;
          if (tau >= cu[b]) u += w[c * K + i] * x[tau * C + c];
        }
        const double s = sigmoid(u);
        r.y[t * C + c] = silu ? u * s : u;
        const double du = dy[t * C + c] * (silu ? s * (1 + u * (1 - s)) : 1.0);
        for (int64_t i = 0; i < K; i++) {
          const int64_t tau = t - (K - 1) + i;
          if (tau < cu[b]) continue;
          r.dx[tau * C + c] += w[c * K + i] * du;
          r.dw[c * K + i] += du * x[tau * C + c];
        }
      }
  return r;
}

// Tolerances against double. float: u sums K <= 4 products of O(1) values and SiLU adds a few
// float ops (fast exp ~2e-7), dx sums K terms: ~1e-6 relative; atol covers values near 0. dw
// sums T terms: its atol scales with T. bf16: every output rounded to bf16 once (2^-8 relative)
// after float arithmetic. double: 1e-13.
template <typename T> double rtol() {
  return std::is_same_v<T, double> ? 1e-13 : std::is_same_v<T, float> ? 1e-5 : 1.0 / 128;
}
template <typename T> double atol() { return std::is_same_v<T, double> ? 1e-13 : 1e-5; }

template <typename T>
void check_conv(const std::vector<int32_t>& lengths, int64_t C, int64_t K, bool silu) {
  const auto cu = offsets(lengths);
  const int64_t T_ = cu.back(), docs = int64_t(lengths.size());
  INFO("tokens " << T_ << " docs " << docs << " C " << C << " K " << K << " silu " << silu);
  Rng rng(uint64_t(T_ * 131 + C * 7 + K + silu));
  auto x = random_vector<T>(rng, T_ * C, -2, 2);
  auto w = random_vector<T>(rng, C * K, -1, 1);
  auto dy = random_vector<T>(rng, T_ * C, -1, 1);
  const Reference ref = reference(widen_all(x), widen_all(w), widen_all(dy), cu, C, K, silu);

  std::vector<T> y(T_ * C), dx(T_ * C), dw(C * K), dx_only(T_ * C), dw_only(C * K);
  cpu::causal_conv1d_fwd<T>(y.data(), x.data(), w.data(), cu.data(), docs, T_, C, K, silu);
  cpu::causal_conv1d_bwd<T>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), cu.data(), docs,
                            T_, C, K, silu);
  cpu::causal_conv1d_bwd<T>(dx_only.data(), nullptr, dy.data(), x.data(), w.data(), cu.data(), docs,
                            T_, C, K, silu);
  cpu::causal_conv1d_bwd<T>(nullptr, dw_only.data(), dy.data(), x.data(), w.data(), cu.data(), docs,
                            T_, C, K, silu);
  check_close(y, ref.y, rtol<T>(), atol<T>(), "y");
  check_close(dx, ref.dx, rtol<T>(), atol<T>(), "dx");
  check_close(dw, ref.dw, rtol<T>(), atol<T>() * double(T_), "dw");
  // One gradient alone is the same computation.
  CHECK(std::memcmp(dx.data(), dx_only.data(), dx.size() * sizeof(T)) == 0);
  CHECK(std::memcmp(dw.data(), dw_only.data(), dw.size() * sizeof(T)) == 0);
}

// Document lengths: a 1-token document, ones shorter than K = 4 (2, 3) and than K = 2 (1), an
// empty one, a document longer than the backward's 32-token tiles.
const std::vector<int32_t> kDocs = {1, 2, 7, 3, 0, 1, 45, 4};

} // namespace

TEST_CASE("conv1d kernel: causal_conv1d_fwd/bwd over packed documents against a double loop",
          "[conv1d]") {
  for (int64_t K : {4, 2})
    for (bool silu : {true, false})
      for (int64_t C : {5, 70}) { // 70: more channels than the kernel's 64-wide accumulator
        check_conv<float>(kDocs, C, K, silu);
        check_conv<double>(kDocs, C, K, silu);
        check_conv<bf16>(kDocs, C, K, silu);
      }
  // One document; K = 1 (a per-channel scale); a single token.
  check_conv<double>({67}, 3, 4, true);
  check_conv<double>({5, 6}, 3, 1, true);
  check_conv<float>({1}, 4, 4, true);
}

TEST_CASE("conv1d kernel: history resets at document starts", "[conv1d]") {
  // Two documents with identical rows: the second's outputs equal the first's (none of the first
  // document leaks into the second), and a document equals the same rows run alone.
  const int64_t C = 3, K = 4, L = 6;
  Rng rng(3);
  auto doc = random_vector<double>(rng, L * C, -1, 1);
  auto w = random_vector<double>(rng, C * K, -1, 1);
  std::vector<double> x = doc;
  x.insert(x.end(), doc.begin(), doc.end());
  const std::vector<int32_t> cu2 = {0, int32_t(L), int32_t(2 * L)}, cu1 = {0, int32_t(L)};
  std::vector<double> y2(2 * L * C), y1(L * C);
  cpu::causal_conv1d_fwd<double>(y2.data(), x.data(), w.data(), cu2.data(), 2, 2 * L, C, K, true);
  cpu::causal_conv1d_fwd<double>(y1.data(), doc.data(), w.data(), cu1.data(), 1, L, C, K, true);
  CHECK(std::memcmp(y2.data(), y1.data(), y1.size() * sizeof(double)) == 0);
  CHECK(std::memcmp(y2.data() + L * C, y1.data(), y1.size() * sizeof(double)) == 0);
}

TEST_CASE("conv1d kernel: results are bit-identical for any thread count", "[conv1d]") {
  // Enough tokens that the backward's 128 token blocks hold more than one 32-token tile, and
  // enough work for the parallel paths.
  std::vector<int32_t> lengths = {3, 1, 2000, 777, 1, 2219};
  const auto cu = offsets(lengths);
  const int64_t T_ = cu.back(), C = 24, K = 4, docs = int64_t(lengths.size());
  Rng rng(11);
  auto x = random_vector<float>(rng, T_ * C, -2, 2);
  auto w = random_vector<float>(rng, C * K, -1, 1);
  auto dy = random_vector<float>(rng, T_ * C, -1, 1);
  auto run = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> out(size_t(2 * T_ * C + C * K));
    float *y = out.data(), *dx = y + T_ * C, *dw = dx + T_ * C;
    cpu::causal_conv1d_fwd<float>(y, x.data(), w.data(), cu.data(), docs, T_, C, K, true);
    cpu::causal_conv1d_bwd<float>(dx, dw, dy.data(), x.data(), w.data(), cu.data(), docs, T_, C, K,
                                  true);
    omp_set_num_threads(before);
    return out;
  };
  const auto one = run(1);
  for (int threads : {2, 3, 8}) {
    INFO("threads " << threads);
    const auto many = run(threads);
    CHECK(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)) == 0);
  }
}
