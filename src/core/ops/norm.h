// Normalizations over the last dim with hand-written backward. x is [..., D]; weight and bias are
// [D] and optional (an undefined tensor means no scale / no shift); all operands share x's dtype
// and device. Statistics and arithmetic run in f32 (f64 for f64 tensors), the output has x's
// dtype, and the per-row rstd (and mean for LayerNorm) is saved for backward.
#pragma once

#include <utility>

#include "src/core/tensor.h"

namespace vlm {

// Qwen3 RMSNorm: x̂ = x * rsqrt(mean(x^2) + eps), y = weight ⊙ x̂ (weight init 1). In bf16 it
// follows HF: x̂ is rounded to bf16 first, then multiplied by the bf16 weight (one more rounding).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
// Qwen3.5 zero-centred RMSNorm: y = x̂ ⊙ (1 + weight) computed in f32, rounded once (weight init
// 0). The weight gradient equals plain RMSNorm's, Σ dy ⊙ x̂.
Tensor rms_norm_zero_centered(const Tensor& x, const Tensor& weight, double eps);
// Residual add + RMSNorm in one kernel (a decoder layer's x1 = x + h; y = norm(x1)): returns
// (x + h, rms_norm(x + h, weight, eps)), or rms_norm_zero_centered when `zero_centered`. h has x's
// shape; weight is [D] or undefined. Bit-identical on the CPU to add() then the norm, forward and
// backward (the sum is rounded to x's dtype before the norm, and in backward the norm's input
// gradient is rounded before it is added to the sum's own gradient, where autograd would add
// them); on CUDA the same formulas in fp32 with the same T-roundings.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& h, const Tensor& weight,
                                       double eps, bool zero_centered = false);
// Qwen3.5 Gated DeltaNet output norm (norm before gate): y = (weight ⊙ x̂) * silu(z); z has x's
// shape. In bf16 as HF: weight ⊙ bf16(x̂) rounded to bf16, times silu(z) in f32, rounded once.
Tensor rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, double eps);
// LayerNorm with biased variance: y = (x - mean) * rsqrt(var + eps) ⊙ weight + bias.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// y = x / sqrt(Σ_j x_j² + eps) over the last dim (Qwen3.5's q/k normalization in the Gated
// DeltaNet layer, eps 1e-6, in fp32). Composed from differentiable ops: the weightless RMSNorm
// with eps / D, x / sqrt(mean(x²) + eps / D) = sqrt(D) · y, scaled by 1 / sqrt(D). bf16 input is
// widened to f32 and the result rounded to bf16 once.
Tensor l2_normalize(const Tensor& x, double eps);

} // namespace vlm
