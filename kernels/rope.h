// Rotary position embedding, rotate-half ("NeoX") layout, on packed [T, H, D] activations.
//
// Two steps so that the tables are built once per batch and shared by every layer, and so that
// MRoPE (3-D position ids) only needs another table builder:
//   1. rope_cos_sin: per token t and frequency slot i < R/2 (R = rotary_dim)
//        inv_freq[i] = 1 / theta^(2i / R),  angle = pos[t] * inv_freq[i],
//      all in acc_t<T> (fp32; f64 for double) exactly as HF does in fp32, then cos/sin rounded to
//      T (HF casts cos/sin to the activation dtype).
//   2. rope_fwd: dims j and j + R/2 (j < R/2) of every head form a rotation pair with the angle of
//      slot j; dims >= R pass through unchanged.
//        y[j]       = x[j] * cos - x[j + R/2] * sin
//        y[j + R/2] = x[j + R/2] * cos + x[j] * sin
//      Every product and the sum are rounded to T, as PyTorch's elementwise ops on T tensors do in
//      HF's `x * cos + rotate_half(x) * sin` (bit-exact for bf16; plain fp32/f64 arithmetic
//      otherwise).
//   rope_bwd applies the inverse rotation (the transpose) with the same rounding as PyTorch's
//   autograd of that expression.
#pragma once

#include <cstdint>

#include "kernels/norm.h"
#include "src/base/dtype.h"

namespace vlm::kernels {

struct RopeShape {
  int64_t tokens = 0;     // T
  int64_t heads = 0;      // H
  int64_t head_dim = 0;   // D
  int64_t rotary_dim = 0; // R, even, <= D
};

namespace cpu {

// cos, sin: [tokens, rotary_dim / 2] (=); positions: [tokens].
template <typename T>
void rope_cos_sin(T* cos, T* sin, const int64_t* positions, int64_t tokens, int64_t rotary_dim,
                  double theta);
// out, x: [T, H, D] contiguous; cos, sin: [T, R/2] from rope_cos_sin. out = rotate(x) (=).
template <typename T>
void rope_fwd(T* out, const T* x, const T* cos, const T* sin, const RopeShape& shape);
// dx = rotate^-1(dy) (=); dims >= R copy dy.
template <typename T>
void rope_bwd(T* dx, const T* dy, const T* cos, const T* sin, const RopeShape& shape);

// Qwen3's per-head q/k RMSNorm followed by RoPE, one (token, head) row at a time
// (kernels/cpu/norm.cpp): n = rms_norm_fwd(x row, w, mode) with its T-roundings, y = rope_fwd(n)
// (=); rstd: [tokens * heads] (=). Bit-identical to rms_norm_fwd then rope_fwd.
template <typename T>
void rms_norm_rope_fwd(T* y, acc_t<T>* rstd, const T* x, const T* w, RmsNormWeight mode,
                       const T* cos, const T* sin, const RopeShape& shape, double eps);
// dn = rope_bwd(dy) rounded to T, then dx and dw (=, each may be null) as rms_norm_bwd from dn:
// bit-identical to the two backward kernels in sequence.
template <typename T>
void rms_norm_rope_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const acc_t<T>* rstd,
                       RmsNormWeight mode, const T* cos, const T* sin, const RopeShape& shape);

} // namespace cpu

// GPU versions (kernels/cuda/rope.cu), T = float or bf16, same formulas and T-roundings; pointers
// on the current device, asynchronous on `stream` (a cudaStream_t). positions: [tokens] int32 or
// int64 on the device. inv_freq is computed on the host exactly as the CPU does (fp32 pow) and
// passed by value, so rotary_dim <= 512.
namespace cuda {

constexpr int64_t kMaxRotaryDim = 512;

template <typename T, typename I>
void rope_cos_sin(T* cos, T* sin, const I* positions, int64_t tokens, int64_t rotary_dim,
                  double theta, void* stream);
template <typename T>
void rope_fwd(T* out, const T* x, const T* cos, const T* sin, const RopeShape& shape, void* stream);
template <typename T>
void rope_bwd(T* dx, const T* dy, const T* cos, const T* sin, const RopeShape& shape, void* stream);

// The fused q/k RMSNorm + RoPE (kernels/cuda/norm.cu): one warp per (token, head) row, every lane
// a set of rotation pairs; the normed value is rounded to T before the rotation as on the CPU.
// Statistics in fp32 (rstd: [tokens * heads]); dw by the deterministic two-pass column reduction.
template <typename T>
void rms_norm_rope_fwd(T* y, float* rstd, const T* x, const T* w, RmsNormWeight mode, const T* cos,
                       const T* sin, const RopeShape& shape, double eps, void* stream);
template <typename T>
void rms_norm_rope_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const float* rstd,
                       RmsNormWeight mode, const T* cos, const T* sin, const RopeShape& shape,
                       void* stream);

} // namespace cuda
} // namespace vlm::kernels
