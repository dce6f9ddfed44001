// cuDNN fused attention (scaled dot-product attention through the cuDNN frontend's graph API),
// the default CUDA attention for bf16 where cuDNN supports the problem; the own flash-style
// kernels (kernels/attention.h) stay the fallback and the reference.
//
// Packed documents reach cuDNN in its ragged ("THD") layout: the graph sees B sequences of at
// most S tokens, [B, H, S, D] with the strides of our packed [T, H, D] rows, and each sequence is
// placed by an element offset (its first token × the row size) and has its own length (padding
// mask). The log-sum-exp ("Stats") is the same [T, Hq] fp32 natural-log LSE of the scaled scores
// that the own kernels keep, so either backward can follow either forward.
//
// Facts, versions and pitfalls: the README's "CUDA attention backends". Host logic (support rules,
// the ragged layout, plan-cache keys) is plain C++ in kernels/attention_cudnn_plan.cpp, built and
// tested without a GPU; the graph code is kernels/cuda/attention_cudnn.cpp (built only with cuDNN
// and the frontend headers, tools/deps/fetch_cudnn_frontend.sh; without them a stub that says so).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "src/base/dtype.h"

namespace vlm::kernels::cudnn_attention {

// Spare rows past the last token in every buffer cuDNN reads or writes: its kernels may touch a
// tile past the end of the packed rows (NVIDIA's own tests round the token count up to 64), and
// write Stats there. Inputs' spare rows are zeros, outputs' are never read.
constexpr int64_t kSpareRows = 128;

// --- what the machine offers, and which backend runs ------------------------------------------

struct Capability {
  int sm = 0;                  // compute capability × 10: 90 for sm_90 (H100/H200/GH200)
  int64_t cudnn_version = 0;   // cudnnGetVersion() of the loaded library: 9.6.0 -> 90600; 0: none
  bool frontend_built = false; // this build holds the graph code (cuDNN + the frontend headers)
};

enum class Backend { cudnn, own_kernel };
// VLM_ATTENTION_BACKEND: "auto" (default: cuDNN where supported and its self-check passes, else
// the own kernel, said once per configuration), "cudnn" (cuDNN or stop with the reason) or
// "own" (the own kernel everywhere).
enum class Request { automatic, cudnn, own_kernel };
Request requested_backend(); // reads VLM_ATTENTION_BACKEND; another value is an error naming it
const char* backend_name(Backend b);
std::string version_text(int64_t cudnn_version); // 90600 -> "9.6.0"

struct Choice {
  Backend backend = Backend::own_kernel;
  std::string reason; // why not cuDNN (empty when cuDNN is chosen)
};

// cuDNN's published support surface for training (forward and backward) of `shape` in `dtype`:
// bf16 only; sm_80 or newer; cuDNN >= 9.6 (int64 ragged offsets, ragged GQA backward); head dim a
// multiple of 8 and <= 256 on sm_90, <= 128 on sm_80/86/89 (and ragged on Ampere/Ada needs 9.18.1),
// <= 128 on sm_100+ except 256 from 9.23; 9.10.0/9.10.1 refused (the frontend does too); 9.11 and
// 9.12 have a Hopper backward bug for head dims > 128. `request` own_kernel always returns the
// own kernel (reason "VLM_ATTENTION_BACKEND=own"). The caller stops when `request` is cudnn and
// the choice is not.
Choice choose_backend(const Capability& cap, const AttentionShape& shape, DType dtype,
                      Request request);

// --- the ragged layout and the plan cache's key -----------------------------------------------

struct RaggedLayout {
  // The graph's B: the non-empty documents (an empty one has nothing to attend to), rounded up to
  // a multiple of 8 with zero-length sequences when `pad_batch`, so batches with a few documents
  // more or less share one plan. Zero-length sequences are only handled right from cuDNN 9.25.
  int64_t batch = 0;
  int64_t max_seq = 0;   // the graph's S: the longest document rounded up to a multiple of 128
  int64_t max_total = 0; // the backward's max_total_seq_len: T rounded up to a multiple of 1024
  std::vector<int32_t> seq_len;      // [batch] tokens of each sequence (0 for padding entries)
  std::vector<int64_t> q_offset;     // [batch + 1] elements: first token × Hq·D (Q, O, dO, dQ)
  std::vector<int64_t> kv_offset;    // [batch + 1] elements: first token × Hkv·D (K, V, dK, dV)
  std::vector<int64_t> stats_offset; // [batch + 1] elements: first token × Hq (the LSE)
};
bool zero_length_supported(int64_t cudnn_version); // >= 9.25.0
// From the B + 1 host offsets of `shape` (checked by the caller). Offsets are int64: token × row
// overflows int32 past 2^31 elements.
RaggedLayout ragged_layout(const int32_t* cu_seqlens, const AttentionShape& shape, bool pad_batch);

// Everything a built graph bakes in: two problems with equal keys may share a plan; any
// difference needs its own (FlashInfer once replayed a graph built for another layout because
// its key lacked the strides). Strides follow from the heads and head dim (packed rows).
struct PlanKey {
  int sm = 0;
  int64_t batch = 0, max_seq = 0, max_total = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = true;
  bool deterministic = true;
  float scale = 0.f; // baked with set_attn_scale(float)
  bool operator==(const PlanKey&) const = default;
  std::string str() const; // "sm90 B8 S256 T1024 Hq16 Hkv8 D128 causal det scale=0.0883883"
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const;
};
PlanKey plan_key(const AttentionShape& shape, const RaggedLayout& layout, int sm,
                 bool deterministic);

// The self-check's configuration key: what can make cuDNN right or wrong on one machine apart from
// the sizes (sm, library versions, heads, head dim, mask, determinism). One check per key and
// process.
std::string check_key(const Capability& cap, const AttentionShape& shape, bool deterministic);

// VLM_ATTENTION_DETERMINISTIC (default 1): cuDNN's deterministic backward (fixed dQ summation
// order; its workspace grows with B·Hq·S²). 0 takes the faster non-deterministic one.
bool deterministic_requested();

// --- the graph code (kernels/cuda/attention_cudnn.cpp) ----------------------------------------
namespace cuda {

bool frontend_built();          // cuDNN and the frontend headers were found at build time
std::string frontend_version(); // "1.32.0", or "not built"
int64_t cudnn_version();        // cudnnGetVersion(); 0 without cuDNN
Capability capability(int device);

// Builds the forward and backward graphs of `key` for its SM and runs the frontend's validate()
// only: no device is needed (a loadable libcudnn is). "" when both validate, else the frontend's
// error code and message. Used by the CPU tests of the graphs we declare.
std::string validate_graphs(const PlanKey& key);

// Forward / backward on the current device and `stream` (a cudaStream_t). Buffers hold T rows
// plus kSpareRows (inputs' spare rows zero): out, q [T, Hq, D]; k, v [T, Hkv, D]; lse [T, Hq]
// fp32; the backward's dq, dk, dv overwritten. `ragged` holds the layout's seq_len and offsets
// on the device, packed as ragged_device_bytes() lays them out. Returns "" when cuDNN ran, else
// why not (a graph it cannot build or plan: the caller falls back); a wrong graph of ours throws.
std::string sdpa_fwd(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                     const void* ragged, const PlanKey& key, void* stream);
std::string sdpa_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                     const bf16* v, const bf16* out, const float* lse, const void* ragged,
                     const PlanKey& key, void* stream);

} // namespace cuda

// The layout's device image: seq_len (int32, padded to 8 bytes), then q_offset, kv_offset and
// stats_offset (int64); uploaded once per batch and configuration (src/core/varlen.h keeps it),
// read by every layer's forward and backward.
std::vector<uint8_t> ragged_device_bytes(const RaggedLayout& layout);
// What the image depends on beyond the offsets (heads, head dim, padding of the batch): the name
// a batch's cache keeps it under, "cuDNN ragged Hq16 Hkv8 D128 padded".
std::string ragged_image_key(const AttentionShape& shape, bool pad_batch);
struct RaggedParts { // byte offsets of the four arrays in that image
  size_t seq_len = 0, q_offset = 0, kv_offset = 0, stats_offset = 0;
};
RaggedParts ragged_parts(int64_t batch);

} // namespace vlm::kernels::cudnn_attention
