// exp and sigmoid in forms the compiler vectorizes. std::exp is a libm call per element, which
// keeps a loop scalar (glibc's vector variants need -ffast-math); the softmaxes of attention and
// cross-entropy and the SwiGLU gate spend most of their time there otherwise. The f64 overloads
// stay exact: f64 runs the gradchecks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace vlm::kernels::cpu {

// exp(x) for x <= 0 (a value minus a row's max or logsumexp): x = n ln2 + r with |r| <= ln2 / 2,
// exp(r) by its degree-6 Taylor polynomial (relative error < 2e-7, about 1.5 ulp), 2^n from the
// exponent bits; below -87 the result is 0 (exp(-87) = 1.6e-38 is the smallest normal float's
// neighbourhood). -inf gives 0, NaN stays NaN. Needs -fno-trapping-math to if-convert the select.
inline float exp_nonpositive(float x) {
  x = std::max(x, -100.0f);        // keeps n in int range (and -inf out of the arithmetic)
  const float magic = 12582912.0f; // 1.5 · 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + magic) - magic;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.0f ? 0.0f : p * two_n;
}
inline double exp_nonpositive(double x) { return std::exp(x); }

// 1 / (1 + exp(-x)) from exp(-|x|), which never overflows.
template <typename A> A sigmoid(A x) {
  const A e = exp_nonpositive(-std::abs(x));
  const A s = A(1) / (A(1) + e);
  return x >= A(0) ? s : e * s;
}

} // namespace vlm::kernels::cpu
