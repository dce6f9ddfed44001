// Rotary position embedding (rotate-half / "NeoX" layout, as HF Qwen3, Qwen3-VL text side and
// Qwen3.5's partial rotary) on packed activations x [T, H, D]. See kernels/rope.h for the exact
// formula and rounding. Dims >= rotary_dim pass through unchanged (Qwen3.5: rotary_dim = D/4).
#pragma once

#include <cstdint>

#include "src/core/tensor.h"

namespace vlm {

// cos/sin of every (token, frequency slot): [T, rotary_dim / 2] each, in the activation dtype
// (computed in fp32, or f64 for f64, then rounded as HF does). Build once per batch and pass to
// every layer; MRoPE will add a builder from 3-D position ids that returns the same tables.
struct RopeTables {
  Tensor cos, sin;
  int64_t rotary_dim = 0;
};

// position_ids: [T] i32 or i64 (restarting per packed document is the caller's business);
// rotary_dim even and in [2, ...]; theta > 0; dtype f32, f64 or bf16.
RopeTables rope_tables(const Tensor& position_ids, int64_t rotary_dim, double theta, DType dtype);

// x: [T, H, D] float; tables from rope_tables with T rows, rotary_dim <= D and x's dtype.
// Differentiable in x (the backward is the inverse rotation); the tables get no gradient.
Tensor rope(const Tensor& x, const RopeTables& tables);
// Convenience: rope(x, rope_tables(position_ids, rotary_dim, theta, x.dtype())).
Tensor rope(const Tensor& x, const Tensor& position_ids, int64_t rotary_dim, double theta);

} // namespace vlm
