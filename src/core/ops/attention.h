// Softmax attention over packed variable-length documents (flash-attention varlen semantics).
// See kernels/attention.h for the numerics.
#pragma once

#include "src/core/tensor.h"
#include "src/core/varlen.h"

namespace vlm {

// q: [T, Hq, D]; k, v: [T, Hkv, D] with Hq % Hkv == 0 (GQA: query head h reads kv head
// h / (Hq / Hkv)); all the same float dtype. cu_seqlens: [B + 1] i32 with cu_seqlens[0] = 0,
// cu_seqlens[B] = T, non-decreasing (an empty document is allowed and contributes nothing).
// Queries attend only within their own document, to every key (causal = false) or to keys at or
// before them (causal = true). scores = scale · q·k (typically scale = D^-0.5); softmax in fp32
// (f64 for f64). Returns [T, Hq, D]; differentiable in q, k and v.
// CUDA: q, k, v on one CUDA device, f32 or bf16, D <= 256 (kernels/cuda/attention_*.cu, flash
// style) reading the tile lists that `varlen` keeps on the device (src/core/varlen.h: built and
// uploaded at the layout's first use, shared by every layer's forward and backward).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const VarlenLayout& varlen,
                 bool causal, double scale);
// The same with the offsets as a tensor (a layout is made from them; layouts with equal offsets
// share their device data): cu_seqlens may live on the CPU (preferred) or the GPU (copied back, a
// synchronization).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                 bool causal, double scale);

} // namespace vlm
