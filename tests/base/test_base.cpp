#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <set>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/base/env.h"
#include "src/base/logging.h"
#include "src/base/rng.h"
#include "src/base/shape.h"

using namespace vlm;

TEST_CASE("base: VLM_CHECK throws vlm::Error with message and repository-relative location",
          "[base]") {
  int x = 3;
  try {
    VLM_CHECK(x == 4, "x is ", x, " not 4");
    FAIL("no throw");
  } catch (const Error& e) {
    std::string m = e.what();
    CHECK(m.find("x is 3 not 4") != std::string::npos);
    // The source as a path in the repository, not the build machine's absolute one.
    CHECK(m.find("[tests/base/test_base.cpp:") != std::string::npos);
    CHECK(m.find("x == 4") != std::string::npos);
  }
  CHECK_NOTHROW([&] { VLM_CHECK(x == 3, "unused"); }());
}

TEST_CASE("base: bf16 conversion is round-to-nearest-even on every bit pattern class", "[base]") {
  // Exhaustive over the 16 dropped bits of a few exponents: compare with exact rounding in double.
  for (uint32_t hi : {0x3f80u, 0x4049u, 0xc2f7u, 0x0001u, 0x7f7fu}) {
    for (uint32_t lo = 0; lo < 65536; lo += 7) {
      uint32_t u = (hi << 16) | lo;
      float f;
      std::memcpy(&f, &u, 4);
      float r = float(bf16(f));
      uint32_t down_bits = hi << 16;
      float down;
      std::memcpy(&down, &down_bits, 4);
      // bf16 spacing at this magnitude (subnormals share the smallest spacing 2^-133).
      double ulp = std::ldexp(1.0, std::max(std::ilogb(std::abs(down)), -126) - 7);
      double up = std::copysign(std::abs(double(down)) + ulp, double(f));
      double dd = std::abs(double(f) - double(down)), du = std::abs(up - double(f));
      double expect = dd < du ? down : du < dd ? up : ((hi & 1) ? up : double(down));
      if (std::abs(expect) >= 0x1p128) expect = std::copysign(INFINITY, double(f)); // overflow
      REQUIRE(double(r) == expect);
    }
  }
  CHECK(std::isinf(float(bf16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(float(bf16(-std::nanf("")))));
}

TEST_CASE("base: f16 conversion round-trips every half value", "[base]") {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = f16::to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    REQUIRE(f16::from_float(f) == uint16_t(h));
  }
  CHECK(float(f16(65504.f)) == 65504.f);
  CHECK(std::isinf(float(f16(70000.f))));
}

TEST_CASE("base: dtype sizes and names", "[base]") {
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(std::string(dtype_name(DType::i64)) == "i64");
  CHECK(is_floating(DType::bf16));
  CHECK_FALSE(is_floating(DType::i32));
}

TEST_CASE("base: rng is deterministic per seed and stream, state restores", "[base]") {
  Rng a(42), b(42), c(42, 1);
  for (int i = 0; i < 10; i++) CHECK(a.next_u64() == b.next_u64());
  CHECK(Rng(42).next_u64() != c.next_u64());
  Rng r(5);
  r.normal();
  auto s = r.state();
  double x1 = r.normal(), x2 = r.uniform();
  r.set_state(s);
  CHECK(r.normal() == x1);
  CHECK(r.uniform() == x2);
  // Moments of 20k normals.
  Rng n(9);
  double m = 0, v = 0;
  const int N = 20000;
  for (int i = 0; i < N; i++) {
    double z = n.normal();
    m += z;
    v += z * z;
  }
  CHECK(std::abs(m / N) < 0.03);
  CHECK(std::abs(v / N - 1) < 0.05);
}

TEST_CASE("base: shapes, strides and dim wrapping", "[base]") {
  CHECK(shape_str({2, 16, 896}) == "(2, 16, 896)");
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(numel({2, 3, 4}) == 24);
  CHECK(wrap_dim(-1, 3, "op") == 2);
  CHECK_THROWS_WITH(wrap_dim(3, 3, "myop"), Catch::Contains("myop: dim 3 out of range"));
}

TEST_CASE("base: env parsing and rank prefix", "[base]") {
  setenv("VLM_TEST_ENV_INT", "17", 1);
  CHECK(env_int("VLM_TEST_ENV_INT", 0) == 17);
  CHECK(env_int("VLM_TEST_ENV_UNSET_XYZ", 5) == 5);
  setenv("VLM_TEST_ENV_INT", "abc", 1);
  CHECK_THROWS_WITH(env_int("VLM_TEST_ENV_INT", 0), Catch::Contains("VLM_TEST_ENV_INT='abc'"));
  set_log_rank(0, 1);
  CHECK(rank_prefix().empty());
  set_log_rank(3, 8);
  CHECK(rank_prefix() == "[rank 3/8] ");
  set_log_rank(0, 1);
}
