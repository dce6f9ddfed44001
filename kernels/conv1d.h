// The causal depthwise conv1d of Qwen3.5's Gated DeltaNet layer (qwen-models.md §3.4.2) over
// packed variable-length documents: the history resets at every document start.
#pragma once

#include <cstdint>

#include "kernels/varlen_offsets.h"
#include "src/base/dtype.h"

namespace vlm::kernels::cpu {

// Causal depthwise conv1d over packed documents (no bias), optionally followed by SiLU:
//   y[t, c] = act( Σ_{i<K} w[c, i] · x[t - (K-1) + i, c] )
// where x rows before the start of t's document read as zero (so no document sees another's
// tokens). x, y: [T, C] (y must not overlap x); w: [C, K] (HF's conv1d.weight [C, 1, K]);
// cu_seqlens [docs + 1] on the host, 0 .. T non-decreasing (empty documents allowed). Sums in
// acc_t<T> over the taps in increasing i, y rounded to T once; T = float, double, bf16. Rows are
// independent: the result does not depend on the thread count.
template <typename T>
void causal_conv1d_fwd(T* y, const T* x, const T* w, const int32_t* cu_seqlens, int64_t docs,
                       int64_t tokens, int64_t channels, int64_t kernel_size, bool silu);
// dx (=, may be null), dw (=, may be null) from dy; recomputes the pre-activation for SiLU
// (du = dy · silu'(u), in acc_t<T>, the forward's rounding of y treated as identity).
// dx[s] = Σ_i w[:, i] · du[s + (K-1) - i] over the tokens of s's document; dw[c, i] =
// Σ_t du[t, c] · x[t - (K-1) + i, c] over the taps inside t's document. dw is reduced over tokens
// in fixed blocks (a function of T only) summed in block order: bit-identical for any thread
// count, no atomics.
template <typename T>
void causal_conv1d_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const int32_t* cu_seqlens,
                       int64_t docs, int64_t tokens, int64_t channels, int64_t kernel_size,
                       bool silu);

} // namespace vlm::kernels::cpu

// CUDA (kernels/cuda/conv1d.cu): the same results for T = float or bf16 (fp32 sums in the CPU
// kernels' order). Every pointer is device memory on the current device, the documents' offsets
// included (offsets.cu_seqlens; the chunk starts are not read); the launchers upload nothing and
// return without synchronizing; `stream` is a cudaStream_t. kernel_size <= kMaxConvTaps. dw is
// deterministic: per-token-block partial sums (the CPU kernel's blocks) added in block order, no
// atomics.
namespace vlm::kernels::cuda {

constexpr int64_t kMaxConvTaps = 8;

template <typename T>
void causal_conv1d_fwd(T* y, const T* x, const T* w, const VarlenOffsets& offsets, int64_t tokens,
                       int64_t channels, int64_t kernel_size, bool silu, void* stream);
template <typename T>
void causal_conv1d_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w,
                       const VarlenOffsets& offsets, int64_t tokens, int64_t channels,
                       int64_t kernel_size, bool silu, void* stream);

} // namespace vlm::kernels::cuda
