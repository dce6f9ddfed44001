// Elementwise activations, softmax and simple unary primitives. Outputs keep x's dtype; the math
// runs in f32 (f64 for f64 tensors). Each op has a hand-written backward that recomputes
// derivatives from the saved input (softmax: from its saved output).
#pragma once

#include <cstdint>

#include "src/core/tensor.h"

namespace vlm {

// torch.nn.functional.gelu's `approximate`: none = exact x * Phi(x) with erf, tanh = the tanh form.
enum class GeluApprox : uint8_t { none, tanh };

Tensor sigmoid(const Tensor& x);
// x * sigmoid(x)
Tensor silu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);
// torch.nn.functional.softplus (beta 1, threshold 20): log(1 + e^x), x itself for x > 20;
// derivative sigmoid(x) (1 above the threshold). Qwen3.5's decay g = -exp(A_log) ·
// softplus(a + dt_bias) runs it in fp32.
Tensor softplus(const Tensor& x);
// silu(gate) * up in one kernel; gate and up have the same shape and dtype.
Tensor swiglu(const Tensor& gate, const Tensor& up);
// Softmax over the last dim (max-subtracted, sums in f32/f64).
Tensor softmax(const Tensor& x);

// Primitives, mainly for compositions in tests: e^x, ln x, 1/sqrt(x), x^2.
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);

} // namespace vlm
