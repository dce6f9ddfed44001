// Normalizations over the last dim: x is a contiguous row-major [rows, dim] array, weights and
// biases are [dim]. Statistics and arithmetic run in acc_t<T> (f32, f64 for double); the forward
// saves the per-row rstd = 1/sqrt(var + eps) (and the mean for LayerNorm) in acc_t<T> so that
// backward does not recompute them. Parameter gradients are reductions over rows done in fixed
// row blocks summed in block order: bit-identical for any thread count, no atomics.
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels {

// How an RMSNorm applies its weight w [dim] to x̂ = x * rstd.
enum class RmsNormWeight : uint8_t {
  none,   // y = x̂ (w unused, may be null)
  scale,  // y = w ⊙ x̂ (Qwen3/HF: x̂ rounded to T first, then the T×T product rounded to T)
  offset, // y = (1 + w) ⊙ x̂ in acc_t<T>, rounded once (Qwen3.5 zero-centred, w init 0)
};

namespace cpu {

// y (=) as selected by `mode`; rstd[r] (=) = 1/sqrt(mean_j x[r,j]^2 + eps).
template <typename T>
void rms_norm_fwd(T* y, acc_t<T>* rstd, const T* x, const T* w, RmsNormWeight mode, int64_t rows,
                  int64_t dim, double eps);
// dx (=) and dw (=) from dy and the saved rstd; pass null for a gradient that is not needed
// (dw must be null for mode none). The T-roundings of the forward are treated as identity.
template <typename T>
void rms_norm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const acc_t<T>* rstd,
                  RmsNormWeight mode, int64_t rows, int64_t dim);

// Gated RMSNorm (Qwen3.5 GDN output norm, norm before gate): n = w ⊙ x̂ (x̂ when w is null),
// y = n * silu(z) (=). For bf16 as HF: x̂ and n rounded to T, times silu(z) in acc, rounded once.
// rstd as in rms_norm_fwd (=). x, z, y share the [rows, dim] layout.
template <typename T>
void rms_norm_gated_fwd(T* y, acc_t<T>* rstd, const T* x, const T* z, const T* w, int64_t rows,
                        int64_t dim, double eps);
// dx, dz, dw (=, each may be null). dz uses the T-rounded n of the forward, so it is the exact
// derivative of the computed output w.r.t. z.
template <typename T>
void rms_norm_gated_bwd(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w,
                        const acc_t<T>* rstd, int64_t rows, int64_t dim);

// Residual add + RMSNorm in one pass over the rows (a decoder layer's x1 = x + h, y = norm(x1)):
// s = x + h rounded to T (=, the bits add() stores), then y and rstd exactly as rms_norm_fwd on s.
template <typename T>
void add_rms_norm_fwd(T* s, T* y, acc_t<T>* rstd, const T* x, const T* h, const T* w,
                      RmsNormWeight mode, int64_t rows, int64_t dim, double eps);
// The gradient of s, the common gradient of x and h (=): ds_in (the gradient reaching s from its
// other uses; null: none) plus rms_norm_bwd's dx on s, the latter rounded to T first, as the
// primitive graph sums two T gradients. dw (=) as rms_norm_bwd; either output may be null.
template <typename T>
void add_rms_norm_bwd(T* ds, T* dw, const T* ds_in, const T* dy, const T* s, const T* w,
                      const acc_t<T>* rstd, RmsNormWeight mode, int64_t rows, int64_t dim);

// LayerNorm with biased variance: y = (x - mean) * rstd ⊙ w + b in acc, rounded once (=); w and
// b may be null (no scale / no shift). mean[r] and rstd[r] (=).
template <typename T>
void layer_norm_fwd(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* w, const T* b,
                    int64_t rows, int64_t dim, double eps);
// dx, dw, db (=, each may be null) from dy and the saved mean/rstd; w may be null (no scale).
template <typename T>
void layer_norm_bwd(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const acc_t<T>* mean,
                    const acc_t<T>* rstd, int64_t rows, int64_t dim);

} // namespace cpu

// The same ops on the GPU (kernels/cuda/norm.cu), T = float or bf16 (statistics in fp32), same
// semantics and T-roundings as the cpu:: versions; all pointers on the current device, `stream` a
// cudaStream_t (nullptr: legacy default stream), every call asynchronous. A row is processed by 1
// warp (dim <= 1024), 4 (dim <= 4096) or 8, with 16-byte vector loads when every row pointer is
// aligned. Parameter gradients (dw, db) are deterministic two-pass reductions: fixed row chunks
// (a function of rows and dim only) write fp32 partials, a second kernel sums them in chunk order;
// no atomics. Temporary partials come from the stream-ordered pool.
namespace cuda {

template <typename T>
void rms_norm_fwd(T* y, float* rstd, const T* x, const T* w, RmsNormWeight mode, int64_t rows,
                  int64_t dim, double eps, void* stream);
template <typename T>
void rms_norm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const float* rstd,
                  RmsNormWeight mode, int64_t rows, int64_t dim, void* stream);
template <typename T>
void add_rms_norm_fwd(T* s, T* y, float* rstd, const T* x, const T* h, const T* w,
                      RmsNormWeight mode, int64_t rows, int64_t dim, double eps, void* stream);
template <typename T>
void add_rms_norm_bwd(T* ds, T* dw, const T* ds_in, const T* dy, const T* s, const T* w,
                      const float* rstd, RmsNormWeight mode, int64_t rows, int64_t dim,
                      void* stream);
template <typename T>
void rms_norm_gated_fwd(T* y, float* rstd, const T* x, const T* z, const T* w, int64_t rows,
                        int64_t dim, double eps, void* stream);
template <typename T>
void rms_norm_gated_bwd(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w,
                        const float* rstd, int64_t rows, int64_t dim, void* stream);
template <typename T>
void layer_norm_fwd(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b,
                    int64_t rows, int64_t dim, double eps, void* stream);
template <typename T>
void layer_norm_bwd(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const float* mean,
                    const float* rstd, int64_t rows, int64_t dim, void* stream);

} // namespace cuda
} // namespace vlm::kernels
