// Raw-pointer kernels against naive loops (no Tensor involved).
#include <catch2/catch.hpp>

#include <vector>

#include "kernels/copy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "src/base/rng.h"

using namespace vlm;
using namespace vlm::kernels;

namespace {
std::vector<double> naive_gemm(const std::vector<double>& a, const std::vector<double>& b,
                               int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
  std::vector<double> c(M * N, 0.0);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++)
      for (int64_t k = 0; k < K; k++)
        c[i * N + j] += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
  return c;
}
} // namespace

TEST_CASE("kernels: gemm f32/f64/bf16 with transposes, beta and batches", "[kernels]") {
  Rng rng(3);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t M = 5, N = 7, K = 3, B = 2;
      std::vector<double> a(B * M * K), b(B * K * N), c0(B * M * N);
      for (auto* v : {&a, &b, &c0})
        for (auto& x : *v) x = rng.uniform(-1, 1);
      cpu::GemmShape s{M, N, K, ta, tb, B, M * K, K * N, M * N};
      std::vector<float> fa(a.begin(), a.end()), fb(b.begin(), b.end()), fc(c0.begin(), c0.end());
      std::vector<double> dc = c0;
      cpu::gemm<float>(fc.data(), fa.data(), fb.data(), s, 1.f, 1.f);
      cpu::gemm<double>(dc.data(), a.data(), b.data(), s, 1.f, 1.f);
      for (int64_t bi = 0; bi < B; bi++) {
        std::vector<double> ab(a.begin() + bi * M * K, a.begin() + (bi + 1) * M * K);
        std::vector<double> bb(b.begin() + bi * K * N, b.begin() + (bi + 1) * K * N);
        auto ref = naive_gemm(ab, bb, M, N, K, ta, tb);
        for (int64_t i = 0; i < M * N; i++) {
          double expect = ref[i] + c0[bi * M * N + i];
          REQUIRE(dc[bi * M * N + i] == Approx(expect).epsilon(1e-12));
          REQUIRE(fc[bi * M * N + i] == Approx(expect).epsilon(1e-5).margin(1e-6));
        }
      }
      std::vector<bf16> ha, hb, hc(M * N);
      for (int64_t i = 0; i < M * K; i++) ha.push_back(bf16(float(a[i])));
      for (int64_t i = 0; i < K * N; i++) hb.push_back(bf16(float(b[i])));
      cpu::GemmShape one{M, N, K, ta, tb, 1, 0, 0, 0};
      cpu::gemm<bf16>(hc.data(), ha.data(), hb.data(), one, 1.f, 0.f);
      std::vector<double> ra, rb;
      for (auto x : ha) ra.push_back(float(x));
      for (auto x : hb) rb.push_back(float(x));
      auto ref = naive_gemm(ra, rb, M, N, K, ta, tb);
      // Inputs are exact bf16 values; only the final rounding to bf16 differs (2^-8 relative).
      for (int64_t i = 0; i < M * N; i++)
        REQUIRE(float(hc[i]) == Approx(ref[i]).epsilon(1.0 / 256).margin(1e-6));
    }
}

TEST_CASE("kernels: strided copy, scatter and casts", "[kernels]") {
  // A 2x3 matrix read transposed.
  std::vector<float> in = {1, 2, 3, 4, 5, 6}, out(6);
  StridedLayout l;
  l.ndim = 2;
  l.shape[0] = 3;
  l.shape[1] = 2;
  l.strides[0] = 1;
  l.strides[1] = 3;
  cpu::copy_strided(out.data(), in.data(), 4, l);
  CHECK(out == std::vector<float>{1, 4, 2, 5, 3, 6});
  std::vector<float> back(6);
  cpu::copy_into_strided(back.data(), l, out.data(), 4);
  CHECK(back == in);
  std::vector<int64_t> ids(6);
  cpu::cast(ids.data(), DType::i64, in.data(), DType::f32, 6);
  CHECK(ids == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  std::vector<bf16> h(6);
  cpu::cast(h.data(), DType::bf16, in.data(), DType::f32, 6);
  std::vector<double> d(6);
  cpu::cast(d.data(), DType::f64, h.data(), DType::bf16, 6);
  CHECK(d == std::vector<double>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("kernels: broadcast binary ops and strided sums", "[kernels]") {
  std::vector<double> a = {1, 2, 3, 4, 5, 6}, b = {10, 20, 30}, out(6);
  BroadcastLayout l;
  l.ndim = 2;
  l.shape[0] = 2;
  l.shape[1] = 3;
  l.stride_a[0] = 3;
  l.stride_a[1] = 1;
  l.stride_b[0] = 0; // b broadcast over rows
  l.stride_b[1] = 1;
  cpu::binary_fwd<double>(BinaryOp::add, out.data(), a.data(), b.data(), l);
  CHECK(out == std::vector<double>{11, 22, 33, 14, 25, 36});
  // Column sums: keep dim 1, reduce dim 0.
  StridedLayout s;
  s.ndim = 2;
  s.shape[0] = 3;
  s.strides[0] = 1;
  s.shape[1] = 2;
  s.strides[1] = 3;
  std::vector<double> sums(3);
  cpu::sum_fwd<double>(sums.data(), a.data(), s, 1);
  CHECK(sums == std::vector<double>{5, 7, 9});
}
