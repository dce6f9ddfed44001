// The gated delta rule (Qwen3.5's Gated DeltaNet core, qwen-models.md §3.4.6) over packed
// variable-length documents.
//
// q, k: [T, HK, dk]; v: [T, HV, dv]; g, beta: [T, HV]; out: [T, HV, dv]; all
// contiguous, the T tokens being `docs` documents back to back (document b spans tokens
// [cu_seqlens[b], cu_seqlens[b+1]), cu_seqlens on the host). Value head j reads q/k head
// j / (HV / HK). Per value head, with a state S [dk, dv] that is zero at every document start (or
// initial_state's), for each token t of the document in order:
//   S <- exp(g_t) · S                        (decay first; g_t <= 0 is the log decay)
//   S <- S + k_t · (beta_t · (v_t - Sᵀ k_t))ᵀ (delta rule on the decayed state)
//   out_t = Sᵀ (scale · q_t)                 (read-out includes token t)
// q and k arrive already L2-normalized (the caller's business). All arithmetic in T (the kernels
// are built for float and double; bf16 activations are widened by the op above).
//
// Two forms compute it: the recurrence (token by token: the reference) and the chunked form
// (qwen-models.md §3.5: chunks of kChunk tokens counted from each document's start, never
// straddling documents; WY/UT transform with T = (I + A)^-1; inter-chunk state recurrence).
// The chunked backward follows §3.6 and recomputes what it needs from the inputs (nothing is
// saved by the forward). Every output element is written by one thread in a fixed order:
// results do not depend on the thread count. GVA: dq and dk are the sums over the HV / HK value
// heads of a k-head, added in head order. The backward takes no gradient of final_state (it is
// treated as unused): gradients are those of the loss through `out` alone.
//
// CPU threading and numerics: OpenMP over (document, value head) pairs; a packed document gives
// the same bits as the document run alone. While they run, the kernels flush subnormals to zero
// (x86 MXCSR FTZ/DAZ on each worker thread, restored on return): strong decays otherwise produce
// them in the chunked form at a large cost. Chunked backward scratch per thread: about
// L·(dk + dv + 64) + (L / 64)·dk·dv values for the longest document of L tokens, plus
// 2·T·HV·dk for the per-value-head dq / dk when HV > HK.
//
// States: initial_state (may be null: zeros) and final_state (out, may be null) are
// [docs, HV, dk, dv]: document b starts from initial_state[b] and leaves final_state[b]
// (generation keeps it between calls).
#pragma once

#include <cstdint>

#include "kernels/varlen_offsets.h"
#include "src/base/dtype.h"

namespace vlm::kernels {

struct GatedDeltaShape {
  int64_t tokens = 0;  // T
  int64_t k_heads = 0; // HK
  int64_t v_heads = 0; // HV, a multiple of HK
  int64_t k_dim = 0;   // dk
  int64_t v_dim = 0;   // dv
  int64_t docs = 0;    // cu_seqlens has docs + 1 entries: 0, ..., T (non-decreasing)
  double scale = 1.0;  // multiplies q, typically dk^-0.5
};

// Tokens per chunk of the chunked form.
constexpr int64_t kGatedDeltaChunk = 64;

namespace cpu {

// The recurrence (reference). out (=), final_state (=, may be null).
template <typename T>
void gated_delta_recurrent_fwd(T* out, T* final_state, const T* q, const T* k, const T* v,
                               const T* g, const T* beta, const T* initial_state,
                               const int32_t* cu_seqlens, const GatedDeltaShape& shape);
// Its backward (reference): dq, dk, dv, dg, dbeta (=); d_initial_state (=, may be null). Keeps
// every per-token state of a document (memory T·HV·dk·dv): for tests and self-checks only.
template <typename T>
void gated_delta_recurrent_bwd(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* d_initial_state,
                               const T* dout, const T* q, const T* k, const T* v, const T* g,
                               const T* beta, const T* initial_state, const int32_t* cu_seqlens,
                               const GatedDeltaShape& shape);

// The chunked form (what the op uses). Same arguments and results as the recurrence.
template <typename T>
void gated_delta_chunk_fwd(T* out, T* final_state, const T* q, const T* k, const T* v, const T* g,
                           const T* beta, const T* initial_state, const int32_t* cu_seqlens,
                           const GatedDeltaShape& shape);
template <typename T>
void gated_delta_chunk_bwd(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* d_initial_state, const T* dout,
                           const T* q, const T* k, const T* v, const T* g, const T* beta,
                           const T* initial_state, const int32_t* cu_seqlens,
                           const GatedDeltaShape& shape);

} // namespace cpu

// CUDA (kernels/cuda/gated_delta.cu), float only (state and arithmetic in fp32): the recurrence,
// with the same results as the CPU kernels. Every pointer is device memory on the current device;
// the documents come as `offsets` (kernels/varlen_offsets.h), already on the device with the chunk
// starts of kGatedDeltaChunk-token chunks (offsets.docs == shape.docs); the calls upload nothing;
// `stream` is a cudaStream_t; the calls are asynchronous.
// dk, dv <= kGatedDeltaMaxDim. Deterministic: no atomics, fixed summation orders.
//  * forward: one block per (document, value head, 32 value columns), a thread per column of S
//    (kept in shared memory) walking the document's tokens in order.
//  * backward: one block per (document, value head) (at most a few per SM at a time, each with
//    its own global scratch), a thread per column of S: a forward pass stores the state at every
//    chunk start (kGatedDeltaChunk tokens), then the chunks are walked backwards, each first
//    recomputing its per-token states. Scratch: the chunk-start states, about
//    (T / 64 + docs) · HV · dk · dv floats, plus up to 512 MiB of per-block buffers, plus
//    2 · T · HV · dk floats for the per-value-head dq / dk when HV > HK (summed in head order by
//    a second kernel).
namespace cuda {

constexpr int64_t kGatedDeltaMaxDim = 256;

void gated_delta_recurrent_fwd(float* out, float* final_state, const float* q, const float* k,
                               const float* v, const float* g, const float* beta,
                               const float* initial_state, const VarlenOffsets& offsets,
                               const GatedDeltaShape& shape, void* stream);
void gated_delta_recurrent_bwd(float* dq, float* dk, float* dv, float* dg, float* dbeta,
                               float* d_initial_state, const float* dout, const float* q,
                               const float* k, const float* v, const float* g, const float* beta,
                               const float* initial_state, const VarlenOffsets& offsets,
                               const GatedDeltaShape& shape, void* stream);

// The chunked form (kernels/cuda/gated_delta_chunk.cu), same arguments and results, fp32 SIMT:
//  * forward: one block of 256 threads per (document, value head, group of up to 32 value
//    columns), walking the document's chunks with the group's state columns and the chunk's
//    q / k rows in shared memory (about 110 KB for dk = 128).
//  * backward: the forward kernel stores the state at every chunk start and V', then one block per
//    (document, value head, column group) walks the chunks backwards (about 210 KB of shared memory
//    for dk = 128; dk = 256 runs groups of 8 columns). Scratch: (T / 64 + docs) · HV · dk · dv +
//    T · HV · dv floats, plus 2 · T · HV · groups · dk + 2 · T · HV · groups for the groups' parts
//    of dq, dk, dg, dbeta (summed in a fixed order by a second kernel; groups = ceil(dv / 32)).
void gated_delta_chunk_fwd(float* out, float* final_state, const float* q, const float* k,
                           const float* v, const float* g, const float* beta,
                           const float* initial_state, const VarlenOffsets& offsets,
                           const GatedDeltaShape& shape, void* stream);
void gated_delta_chunk_bwd(float* dq, float* dk, float* dv, float* dg, float* dbeta,
                           float* d_initial_state, const float* dout, const float* q,
                           const float* k, const float* v, const float* g, const float* beta,
                           const float* initial_state, const VarlenOffsets& offsets,
                           const GatedDeltaShape& shape, void* stream);

} // namespace cuda
} // namespace vlm::kernels
