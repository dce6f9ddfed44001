// The first-use self-check of CUDA kernels (src/core/ops/self_check.h): the decision per key
// (pass, fall back, throw in strict mode, trust when off, refuse in fallback mode), its caching,
// and the error measure. No device needed: the measurement is a stand-in function.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "src/core/ops/self_check.h"
#include "tests/error_of.h"

using vlm::ops_detail::gpu_kernel_passes;
using vlm::ops_detail::max_rel_error;
using vlm::ops_detail::self_check_mode;
using vlm::ops_detail::SelfCheckMode;

namespace {

// Sets VLM_GPU_SELF_CHECK for one scope (unset when value is null), unset again afterwards.
struct ModeGuard {
  explicit ModeGuard(const char* value) {
    if (value)
      setenv("VLM_GPU_SELF_CHECK", value, 1);
    else
      unsetenv("VLM_GPU_SELF_CHECK");
  }
  ~ModeGuard() { unsetenv("VLM_GPU_SELF_CHECK"); }
};

// A measurement that returns `error` and counts its calls.
struct Measure {
  double error;
  int calls = 0;
  double operator()() {
    calls++;
    return error;
  }
};

bool passes(const std::string& key, double tolerance, Measure& m) {
  return gpu_kernel_passes(key, tolerance, [&] { return m(); });
}

} // namespace

TEST_CASE("self-check: a kernel within tolerance is used, measured once per key") {
  ModeGuard mode(nullptr);
  Measure m{1e-6};
  CHECK(passes("test pass", 1e-4, m));
  CHECK(passes("test pass", 1e-4, m));
  CHECK(m.calls == 1);
  Measure other{1e-6};
  CHECK(passes("test pass, another key", 1e-4, other));
  CHECK(other.calls == 1);
  Measure exact{1e-4}; // the tolerance itself passes
  CHECK(passes("test pass at tolerance", 1e-4, exact));
}

TEST_CASE("self-check: a mismatch falls back for good (default and 'on')") {
  for (const char* value : {static_cast<const char*>(nullptr), "on"}) {
    ModeGuard mode(value);
    const std::string key = std::string("test mismatch ") + (value ? value : "unset");
    Measure m{2e-3};
    CHECK_FALSE(passes(key, 1e-4, m));
    CHECK_FALSE(passes(key, 1e-4, m));
    CHECK(m.calls == 1);
  }
  ModeGuard mode(nullptr);
  Measure nan{NAN}, inf{INFINITY};
  CHECK_FALSE(passes("test mismatch nan", 1e-4, nan));
  CHECK_FALSE(passes("test mismatch inf", 1e-4, inf));
  // A kernel that throws (say, a launch failure) counts as a mismatch.
  int calls = 0;
  auto throwing = [&]() -> double {
    calls++;
    throw std::runtime_error("too many resources requested for launch");
  };
  CHECK_FALSE(gpu_kernel_passes("test mismatch throws", 1e-4, throwing));
  CHECK_FALSE(gpu_kernel_passes("test mismatch throws", 1e-4, throwing));
  CHECK(calls == 1);
}

TEST_CASE("self-check: strict mode throws on a mismatch, every time, naming key and error") {
  ModeGuard mode("strict");
  Measure m{0.5};
  const std::string first = vlm::testing::error_of([&] { passes("test strict dk=8", 1e-4, m); });
  CHECK(first.find("test strict dk=8") != std::string::npos);
  CHECK(first.find("0.5") != std::string::npos);
  CHECK(first.find("strict") != std::string::npos);
  const std::string again = vlm::testing::error_of([&] { passes("test strict dk=8", 1e-4, m); });
  CHECK(again.find("test strict dk=8") != std::string::npos);
  CHECK(m.calls == 1);
  // A passing kernel is used in strict mode too.
  Measure good{1e-7};
  CHECK(passes("test strict good", 1e-4, good));
  // The throw's message is quoted.
  const std::string thrown = vlm::testing::error_of([] {
    gpu_kernel_passes("test strict throws", 1e-4,
                      []() -> double { throw std::runtime_error("launch failed: XYZ"); });
  });
  CHECK(thrown.find("launch failed: XYZ") != std::string::npos);
}

TEST_CASE("self-check: off trusts the kernel, fallback refuses it, neither measures") {
  {
    ModeGuard mode("off");
    CHECK(self_check_mode() == SelfCheckMode::off);
    Measure m{1.0};
    CHECK(passes("test off", 1e-4, m));
    CHECK(m.calls == 0);
  }
  {
    ModeGuard mode("fallback");
    CHECK(self_check_mode() == SelfCheckMode::fallback);
    Measure m{0.0};
    CHECK_FALSE(passes("test fallback", 1e-4, m));
    CHECK(m.calls == 0);
  }
  {
    ModeGuard mode(nullptr);
    CHECK(self_check_mode() == SelfCheckMode::on);
  }
  {
    ModeGuard mode("strict");
    CHECK(self_check_mode() == SelfCheckMode::strict);
  }
  ModeGuard mode("sometimes");
  CHECK(vlm::testing::error_of([] { self_check_mode(); }).find("VLM_GPU_SELF_CHECK") !=
        std::string::npos);
}

TEST_CASE("self-check: max-norm relative error") {
  CHECK(max_rel_error({1, 2, 4}, {1, 2, 4}) == 0);
  CHECK(max_rel_error({1, 2.5, 4}, {1, 2, 4}) == Approx(0.125));
  CHECK(max_rel_error({0, 0.5}, {0, 0}) == Approx(0.5)); // all-zero reference: absolute
  CHECK(std::isinf(max_rel_error({NAN, 1}, {1, 1})));
  CHECK(std::isinf(max_rel_error({1, 1}, {1})));
  CHECK(max_rel_error({NAN, 1}, {NAN, 1}) == 0);
}
