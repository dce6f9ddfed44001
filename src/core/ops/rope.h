// Rotary position embedding (rotate-half / "NeoX" layout, as HF Qwen3, Qwen3-VL text side and
// Qwen3.5's partial rotary) on packed activations x [T, H, D]. See kernels/rope.h for the exact
// formula and rounding. Dims >= rotary_dim pass through unchanged (Qwen3.5: rotary_dim = D/4).
#pragma once

#include <array>
#include <cstdint>

#include "src/core/tensor.h"

namespace vlm {

// cos/sin of every (token, frequency slot): [T, rotary_dim / 2] each, in the activation dtype
// (computed in fp32, or f64 for f64, then rounded as HF does). Build once per batch and pass to
// every layer; mrope_tables builds them from 3-D position ids.
struct RopeTables {
  Tensor cos, sin;
  int64_t rotary_dim = 0;
};

// position_ids: [T] i32 or i64 (restarting per packed document is the caller's business);
// rotary_dim even and in [2, ...]; theta > 0; dtype f32, f64 or bf16.
RopeTables rope_tables(const Tensor& position_ids, int64_t rotary_dim, double theta, DType dtype);

// Interleaved MRoPE (Qwen3-VL and Qwen3.5 text side, qwen-models.md §2.2): position_ids [3, T]
// (rows t, h, w; i32 or i64). Frequency slot i < R/2 takes its angle from row h when i % 3 == 1
// and i < 3·sections[1], from row w when i % 3 == 2 and i < 3·sections[2], else from row t (so
// the tail past 3·min(sections) stays t). sections[0] + [1] + [2] = R/2. The slots interleave the
// frequency index, not the head-dim halves: dims j and j + R/2 share slot j. Equal rows (pure
// text) give exactly rope_tables of that row.
RopeTables mrope_tables(const Tensor& position_ids, int64_t rotary_dim, double theta,
                        const std::array<int64_t, 3>& sections, DType dtype);

// x: [T, H, D] float; tables from rope_tables with T rows, rotary_dim <= D and x's dtype.
// Differentiable in x (the backward is the inverse rotation); the tables get no gradient.
Tensor rope(const Tensor& x, const RopeTables& tables);
// Qwen3's per-head q/k RMSNorm then RoPE in one kernel:
//   rope(zero_centered ? rms_norm_zero_centered(x, weight, eps) : rms_norm(x, weight, eps), tables)
// x: [T, H, D] float, weight [D] (or undefined: no weight), tables as for rope() (partial rotary
// and MRoPE tables included). Differentiable in x and weight. Bit-identical on the CPU to the two
// ops in sequence, forward and backward (the normed value is rounded to x's dtype before the
// rotation, the rotated-back gradient before the norm's backward); on CUDA the same formulas and
// T-roundings in fp32.
Tensor rms_norm_rope(const Tensor& x, const Tensor& weight, double eps, const RopeTables& tables,
                     bool zero_centered = false);

// Convenience: rope(x, rope_tables(position_ids, rotary_dim, theta, x.dtype())).
Tensor rope(const Tensor& x, const Tensor& position_ids, int64_t rotary_dim, double theta);

} // namespace vlm
