// Helpers for the raw-pointer kernel tests (tests/kernels/test_<family>.cpp): random inputs made
// in double and stored in the kernel's type T, their exact values widened back to double for the
// test's own reference loop (so the reference sees what the kernel saw, rounding of the inputs to
// T included), and an element-wise closeness check that names the first element out of bounds.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <vector>

#include "src/base/dtype.h"
#include "src/base/rng.h"

namespace vlm::testing {

// n values uniform in [lo, hi), rounded to T.
template <typename T> std::vector<T> random_vector(Rng& rng, int64_t n, double lo, double hi) {
  std::vector<T> v;
  v.reserve(size_t(n));
  for (int64_t i = 0; i < n; i++) v.push_back(T(rng.uniform(lo, hi)));
  return v;
}

template <typename T> double widen(T v) { return double(static_cast<float>(v)); }
template <> inline double widen<double>(double v) { return v; }

// The exact values of a T buffer as doubles.
template <typename T> std::vector<double> widen_all(const std::vector<T>& v) {
  std::vector<double> d;
  d.reserve(v.size());
  for (const T& x : v) d.push_back(widen(x));
  return d;
}

// Requires |got[i] - want[i]| <= atol + rtol * |want[i]| for i < n (NaN fails); on failure
// reports how many elements are off and the first of them.
template <typename T>
void check_close(const T* got, const double* want, int64_t n, double rtol, double atol,
                 const char* what) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    const double g = widen(got[i]);
    if (!(std::abs(g - want[i]) <= atol + rtol * std::abs(want[i]))) {
      if (first < 0) first = i;
      bad++;
    }
  }
  std::ostringstream msg;
  msg << std::setprecision(10) << what << ": " << bad << " of " << n << " elements off";
  if (first >= 0)
    msg << "; first [" << first << "]: got " << widen(got[first]) << ", want " << want[first]
        << " (rtol " << rtol << ", atol " << atol << ")";
  INFO(msg.str());
  CHECK(bad == 0);
}

template <typename T>
void check_close(const std::vector<T>& got, const std::vector<double>& want, double rtol,
                 double atol, const char* what) {
  REQUIRE(got.size() == want.size());
  check_close(got.data(), want.data(), int64_t(got.size()), rtol, atol, what);
}

} // namespace vlm::testing
