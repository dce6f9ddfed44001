// kernels/rope.h (cpu::rope_cos_sin, rope_fwd, rope_bwd) on raw buffers against plain
// double-precision loops: the HF rotate-half formulas, written here.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/rope.h"
#include "src/base/rng.h"
#include "tests/kernels/kernel_reference.h"

using namespace vlm;
using namespace vlm::kernels;
using vlm::testing::check_close;
using vlm::testing::random_vector;
using vlm::testing::widen_all;

namespace {

// cos/sin of pos * theta^(-2i/R) for i < R/2, [tokens, R/2] each.
void cos_sin_ref(std::vector<double>& c, std::vector<double>& s, const std::vector<int64_t>& pos,
                 int64_t rotary_dim, double theta) {
  const int64_t half = rotary_dim / 2;
  c.assign(pos.size() * size_t(half), 0.0);
  s.assign(pos.size() * size_t(half), 0.0);
  for (size_t t = 0; t < pos.size(); t++)
    for (int64_t i = 0; i < half; i++) {
      const double angle = double(pos[t]) / std::pow(theta, 2.0 * double(i) / double(rotary_dim));
      c[t * size_t(half) + size_t(i)] = std::cos(angle);
      s[t * size_t(half) + size_t(i)] = std::sin(angle);
    }
}

// y = rotate(x) (inverse: the transposed rotation) per head, dims >= R copied.
std::vector<double> rotate_ref(const std::vector<double>& x, const std::vector<double>& c,
                               const std::vector<double>& s, const RopeShape& sh, bool inverse) {
  std::vector<double> y(x.size());
  const int64_t half = sh.rotary_dim / 2, D = sh.head_dim;
  for (int64_t t = 0; t < sh.tokens; t++)
    for (int64_t h = 0; h < sh.heads; h++) {
      const int64_t base = (t * sh.heads + h) * D;
      for (int64_t d = 0; d < D; d++) {
        if (d >= sh.rotary_dim) {
          y[base + d] = x[base + d];
          continue;
        }
        const int64_t i = d % half; // frequency slot
        const double cs = c[t * half + i], sn = inverse ? -s[t * half + i] : s[t * half + i];
        // rotate_half(x)[d] = -x[d + half] for d < half, x[d - half] otherwise
        const double rot = d < half ? -x[base + d + half] : x[base + d - half];
        y[base + d] = x[base + d] * cs + rot * sn;
      }
    }
  return y;
}

} // namespace

TEST_CASE("rope kernel: rope_cos_sin against double cos/sin of pos * theta^(-2i/R)", "[rope]") {
  const std::vector<int64_t> pos = {0, 1, 2, 7, 63, 100, 5, 0};
  const int64_t tokens = int64_t(pos.size());
  for (int64_t R : {2, 6, 16, 34}) {
    INFO("rotary_dim " << R);
    std::vector<double> c_ref, s_ref;
    cos_sin_ref(c_ref, s_ref, pos, R, 10000.0);
    std::vector<float> cf(c_ref.size()), sf(c_ref.size());
    cpu::rope_cos_sin<float>(cf.data(), sf.data(), pos.data(), tokens, R, 10000.0);
    // fp32 on purpose (as HF): the angle pos * inv_freq carries ~2 float roundings plus pow's
    // few ulps, an absolute error of ~4e-7 * |angle| <= 4e-5 at pos 100; cos/sin pass it on.
    check_close(cf, c_ref, 0, 5e-5, "cos f32");
    check_close(sf, s_ref, 0, 5e-5, "sin f32");
    std::vector<double> cd(c_ref.size()), sd(c_ref.size());
    cpu::rope_cos_sin<double>(cd.data(), sd.data(), pos.data(), tokens, R, 10000.0);
    check_close(cd, c_ref, 0, 1e-12, "cos f64");
    check_close(sd, s_ref, 0, 1e-12, "sin f64");
  }
  // A long context in double: angles up to 1e5 keep ~1e-11 absolute accuracy.
  const std::vector<int64_t> far = {100000, 65535, 32768};
  std::vector<double> c_ref, s_ref, cd(3 * 4), sd(3 * 4);
  cos_sin_ref(c_ref, s_ref, far, 8, 1e6);
  cpu::rope_cos_sin<double>(cd.data(), sd.data(), far.data(), 3, 8, 1e6);
  check_close(cd, c_ref, 0, 1e-9, "cos f64 far");
  check_close(sd, s_ref, 0, 1e-9, "sin f64 far");
}

TEST_CASE("rope kernel: rope_fwd/bwd rotate pairs (j, j + R/2) and pass dims >= R through",
          "[rope]") {
  // (tokens, heads, head_dim, rotary_dim): full rotation; partial with odd pass-through; the
  // smallest rotation; one token; a long head.
  const std::vector<RopeShape> shapes = {
      {3, 2, 8, 8}, {5, 3, 7, 4}, {2, 1, 3, 2}, {1, 4, 10, 6}, {4, 2, 130, 128}};
  for (const RopeShape& sh : shapes) {
    INFO("T " << sh.tokens << " H " << sh.heads << " D " << sh.head_dim << " R " << sh.rotary_dim);
    Rng rng(uint64_t(sh.head_dim * 31 + sh.rotary_dim));
    const int64_t n = sh.tokens * sh.heads * sh.head_dim, half = sh.rotary_dim / 2;
    // Arbitrary angles: the rotation kernels take the tables as given.
    std::vector<double> angle(size_t(sh.tokens * half));
    for (auto& a : angle) a = rng.uniform(-3.2, 3.2);
    std::vector<float> cf, sf;
    for (double a : angle) {
      cf.push_back(float(std::cos(a)));
      sf.push_back(float(std::sin(a)));
    }
    auto x = random_vector<float>(rng, n, -2, 2);
    auto dy = random_vector<float>(rng, n, -2, 2);
    const auto cd = widen_all(cf), sd = widen_all(sf), xd = widen_all(x), dyd = widen_all(dy);

    std::vector<float> y(n), dx(n);
    cpu::rope_fwd<float>(y.data(), x.data(), cf.data(), sf.data(), sh);
    cpu::rope_bwd<float>(dx.data(), dy.data(), cf.data(), sf.data(), sh);
    // Each output is x1 c -+ x2 s with |x|, |c|, |s| <= 2, 1, 1: three float roundings of
    // values <= 4, about 3 * 2^-24 * 4 < 1e-6 absolute.
    check_close(y, rotate_ref(xd, cd, sd, sh, false), 0, 1e-6, "fwd");
    check_close(dx, rotate_ref(dyd, cd, sd, sh, true), 0, 1e-6, "bwd");
    // Pass-through dims are copied bit for bit.
    for (int64_t i = 0; i < n; i++)
      if (i % sh.head_dim >= sh.rotary_dim) REQUIRE(y[i] == x[i]);

    // bwd is the transpose of fwd: <rope(x), dy> = <x, rope_bwd(dy)> (in double).
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < n; i++) {
      lhs += double(y[i]) * dyd[i];
      rhs += xd[i] * double(dx[i]);
    }
    CHECK(lhs == Approx(rhs).margin(1e-5 * double(n)));

    // f64: the same formulas to 1e-14.
    std::vector<double> yd(n), dxd(n);
    cpu::rope_fwd<double>(yd.data(), xd.data(), cd.data(), sd.data(), sh);
    cpu::rope_bwd<double>(dxd.data(), dyd.data(), cd.data(), sd.data(), sh);
    check_close(yd, rotate_ref(xd, cd, sd, sh, false), 0, 1e-14, "fwd f64");
    check_close(dxd, rotate_ref(dyd, cd, sd, sh, true), 0, 1e-14, "bwd f64");
  }
}

TEST_CASE("rope kernel: bf16 rope_fwd within a few bf16 roundings of the double rotation",
          "[rope]") {
  const RopeShape sh{3, 2, 12, 8};
  Rng rng(11);
  const int64_t n = sh.tokens * sh.heads * sh.head_dim;
  const std::vector<int64_t> pos = {0, 3, 17};
  std::vector<bf16> c(size_t(sh.tokens * 4)), s(size_t(sh.tokens * 4));
  cpu::rope_cos_sin<bf16>(c.data(), s.data(), pos.data(), sh.tokens, sh.rotary_dim, 10000.0);
  auto x = random_vector<bf16>(rng, n, -2, 2);
  std::vector<bf16> y(n);
  cpu::rope_fwd<bf16>(y.data(), x.data(), c.data(), s.data(), sh);
  const auto cd = widen_all(c), sd = widen_all(s), xd = widen_all(x);
  const auto ref = rotate_ref(xd, cd, sd, sh, false);
  // Each product and the sum are rounded to bf16 (unit roundoff 2^-8): the error is at most
  // 2^-8 (|x1 c| + |x2 s| + |y|) <= 2^-8 * (2.83 + 2.83) = 0.022 for |x| <= 2.
  check_close(y, ref, 0, 0.025, "fwd bf16");
  // The tables are cos/sin of the positions rounded to bf16: at most 2^-9 absolute for |v| <= 1
  // (plus the fp32 angle's ~1e-5).
  std::vector<double> c_ref, s_ref;
  cos_sin_ref(c_ref, s_ref, pos, sh.rotary_dim, 10000.0);
  check_close(c, c_ref, 0, 2.5e-3, "cos bf16");
  check_close(s, s_ref, 0, 2.5e-3, "sin bf16");
}
