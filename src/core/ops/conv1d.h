// The causal depthwise conv1d of Qwen3.5's Gated DeltaNet layer (qwen-models.md §3.4.2) over packed
// variable-length documents. See kernels/conv1d.h for the numerics.
#pragma once

#include "src/core/tensor.h"
#include "src/core/varlen.h"

namespace vlm {

// y[t, c] = act( Σ_{i<K} weight[c, i] · x[t - (K-1) + i, c] ), act = SiLU when `silu` (else the
// identity), where rows before the start of t's document read as zero (no bias). x: [T, C];
// weight: [C, K] (HF's conv1d.weight [C, 1, K] squeezed), x's dtype and device; cu_seqlens:
// [docs+1] i32 on the CPU, 0 .. T non-decreasing (empty documents allowed). Sums in f32 (f64 for
// f64), the result has x's dtype. Differentiable in x and weight (the weight gradient is
// bit-identical for any thread count). CUDA (f32, bf16; K <= 8): kernels/cuda/conv1d.cu, checked
// against the CPU kernel on first use per configuration (src/core/ops/self_check.h); the kernels
// read the offsets that `varlen` keeps on the device (src/core/varlen.h: one upload per batch).
Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const VarlenLayout& varlen, bool silu);
// The same with the offsets as a tensor (a layout is made from them).
Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& cu_seqlens, bool silu);

} // namespace vlm
