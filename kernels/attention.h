// Softmax attention over packed variable-length documents (flash-attention "varlen" layout).
//
// q: [T, Hq, D], k/v: [T, Hkv, D], out: [T, Hq, D], all contiguous; the T tokens are B documents
// back to back, document b spanning tokens [cu_seqlens[b], cu_seqlens[b+1]). A query attends only
// to keys of its own document: all of them (bidirectional) or those at or before it (causal).
// GQA: query head h reads kv head h / (Hq / Hkv).
//
// Numerics: scores, softmax and the P·V sums run in acc_t<T> (fp32; f64 for double) from T
// inputs; each output element is rounded to T once. The forward saves the per-row logsumexp
// lse = max + log(sum(exp(s - max))) of the scaled scores, [T, Hq] in acc_t<T>; the backward
// recomputes P = exp(s - lse) from it (flash-attention style, O(T) memory):
//   D_i = dO_i · O_i,  dP = dO V^T,  dS = P ⊙ (dP - D_i),
//   dQ = scale · dS K,  dK = scale · dS^T Q,  dV = P^T dO
// with dK/dV summed over the query heads that share a kv head. Work is split into blocks of
// rows (queries in the forward and for dQ, keys for dK/dV), so no two threads write the same
// element and results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "src/base/dtype.h"

namespace vlm::kernels {

struct AttentionShape {
  int64_t tokens = 0;   // T
  int64_t q_heads = 0;  // Hq, a multiple of kv_heads
  int64_t kv_heads = 0; // Hkv
  int64_t head_dim = 0; // D
  int64_t docs = 0;     // B; cu_seqlens has B + 1 entries: 0, ..., T (non-decreasing)
  bool causal = true;
  double scale = 1.0; // multiplies q·k, typically D^-0.5
};

namespace cpu {

// out (=), lse (=): [T, Hq] logsumexp of each query row's scaled scores.
template <typename T>
void attention_fwd(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v,
                   const int32_t* cu_seqlens, const AttentionShape& shape);
// dq, dk, dv (=) from dout and the forward's inputs, output and lse.
template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const acc_t<T>* lse, const int32_t* cu_seqlens,
                   const AttentionShape& shape);

} // namespace cpu
} // namespace vlm::kernels
