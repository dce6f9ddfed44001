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
// with dK/dV summed over the query heads that share a kv head. No two threads write the same
// element and no sum's order depends on the thread count, so results do not either (CPU: the
// forward splits work by blocks of query rows, the backward by (document, query head), each
// with its own dK/dV summed over the group afterwards, or, with more threads than those pairs
// keep busy, by blocks of keys (dK/dV) and of queries (dQ) in the same sums; CUDA: below).
#pragma once

#include <cstdint>

#include "kernels/attention_tiles.h"
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

// The tile lists (kernels/attention_tiles.h) the CUDA flash kernels launch over for `shape` in
// `dtype`: the forward and dQ over `queries`, dK/dV over `keys` (equal specs: one list serves
// both). Rows per tile: 64 queries for head_dim <= 128, else 32; keys like queries on tensor cores
// (bf16), 32 in the fp32 SIMT dK/dV kernel. Host logic (kernels/cpu/attention_tiles.cpp).
struct FlashTileSpecs {
  TileSpec queries, keys;
};
FlashTileSpecs flash_tile_specs(const AttentionShape& shape, DType dtype);
int32_t flash_query_rows(int64_t head_dim);
// VLM_ATTENTION_SIMT=1: bf16 runs the fp32 SIMT kernels instead of tensor cores (read per call).
bool attention_simt_only();

// CUDA (kernels/cuda/attention_fwd.cu, _bwd.cu, _ref.cu). T is float or bf16 (fp32 accumulation,
// lse in fp32); every pointer is device memory on the current device; `stream` is a cudaStream_t
// (nullptr: legacy default stream); the calls are asynchronous and upload nothing. head_dim <= 256,
// q_heads <= 65535. Results are deterministic: every output element is written by one thread with
// a fixed summation order (no atomics).
namespace cuda {

// Flash-attention-2 style tiled kernels (what the attention op uses). The forward keeps a
// running max and sum per query row over key tiles (online softmax) and saves lse; the backward
// recomputes P per tile from lse: one pass over (key tile, kv head) blocks accumulates dK/dV for
// its keys over all the query rows and query heads that see them, a second pass over (query
// tile, query head) blocks computes dQ. f32 runs on fp32 SIMT arithmetic; bf16 runs every
// product on tensor cores (wmma, fp32 accumulation, P and dS rounded to bf16 as operands, as
// flash attention does; VLM_ATTENTION_SIMT=1 selects the fp32 SIMT kernels for bf16 too).
// query_tiles, key_tiles: the lists of flash_tile_specs(shape, T's dtype) on the device, built
// by the caller (once per batch: src/core/varlen.h); a list of another spec is refused.
template <typename T>
void attention_fwd(T* out, float* lse, const T* q, const T* k, const T* v,
                   const TileList& query_tiles, const AttentionShape& shape, void* stream);
template <typename T>
void attention_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                   const T* out, const float* lse, const TileList& key_tiles,
                   const TileList& query_tiles, const AttentionShape& shape, void* stream);

// Reference kernels for tests: one thread per query row (forward, dQ) or key row (dK/dV) in
// blocks of 64 rows per head, two-pass softmax in fp32 exactly as the CPU kernel orders it; slow.
// cu_seqlens_device: the B + 1 offsets in device memory.
template <typename T>
void attention_ref_fwd(T* out, float* lse, const T* q, const T* k, const T* v,
                       const int32_t* cu_seqlens_device, const AttentionShape& shape, void* stream);
template <typename T>
void attention_ref_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                       const T* out, const float* lse, const int32_t* cu_seqlens_device,
                       const AttentionShape& shape, void* stream);

} // namespace cuda
} // namespace vlm::kernels
