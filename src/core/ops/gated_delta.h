// The gated delta rule, the core of Qwen3.5's Gated DeltaNet layer (qwen-models.md §3.4.6), over
// packed variable-length documents. See kernels/gated_delta.h for the recurrence and the chunked
// form the op runs.
#pragma once

#include "src/core/tensor.h"
#include "src/core/varlen.h"

namespace vlm {

// q, k: [T, HK, dk] (already L2-normalized: the caller's business, see l2_normalize);
// v: [T, HV, dv] with HV a multiple of HK (value head j reads q/k head j / (HV / HK));
// g (log decay, <= 0), beta: [T, HV]; all the same float dtype and device. cu_seqlens: [docs+1]
// i32 on the CPU, 0 .. T non-decreasing (empty documents allowed). Per value head and document,
// from a zero state S [dk, dv] at the document start, token by token:
//   S <- exp(g_t) · S;  S <- S + k_t (beta_t (v_t - Sᵀ k_t))ᵀ;  out_t = Sᵀ (scale · q_t).
// Returns out [T, HV, dv] in the inputs' dtype. f32 and f64 run in their own precision; bf16 is
// widened to f32 (as HF runs this core in fp32), the result rounded to bf16 once. Runs the chunked
// kernels (cpu::gated_delta_chunk_fwd/bwd); differentiable in q, k, v, g and beta.
//
// state (generation; no gradient): when non-null, *state, if defined, is the initial state
// [docs, HV, dk, dv] (f32; f64 for f64 inputs) that document b starts from (undefined: zeros),
// and *state is replaced by the final states (same shape and dtype). Passing a state while
// recording a graph (grad mode on and an input that requires grad) throws.
// CUDA (f32 compute, dk, dv <= 256): the recurrence kernels of kernels/cuda/gated_delta.cu (not
// yet the chunked tensor-core form), checked against the CPU recurrence on first use per (dk, dv)
// (src/core/ops/self_check.h): on a mismatch the op runs the CPU kernel on host copies. The
// kernels read the offsets and chunk starts that `varlen` keeps on the device (src/core/varlen.h:
// one upload per batch).
Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const VarlenLayout& varlen, double scale,
                        Tensor* state = nullptr);
// The same with the offsets as a tensor (a layout is made from them).
Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const Tensor& cu_seqlens, double scale,
                        Tensor* state = nullptr);

} // namespace vlm
