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
// Facts, versions and pitfalls: docs/gpu.md, "CUDA attention backends". Host logic (support rules,
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

// Rows past the last row a problem addresses (its tokens, then one row per padding sequence) that
// every buffer cuDNN reads or writes holds besides: its kernels may touch a tile past the end
// (NVIDIA's own tests round the token count up to 64). Inputs' spare rows are zero; outputs'
// spare rows are zeroed before a backward reads them (O, Stats) — never left as pool memory, whose
// NaN would reach dO·O or exp(S - LSE) on tiles past a sequence's end.
constexpr int64_t kTileSlack = 128;

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

// --- plan buckets: a small fixed set of graphs per configuration and row count ---------------
//
// A graph bakes in B (sequences), S (the longest) and the backward's max_total_seq_len; building
// one takes seconds with the GPU idle. Packed batches would give tens to hundreds of distinct
// exact sizes, so every size is rounded up to a level, and a configuration running T tokens per
// call meets at most 16 graphs (4 batch levels x 4 sequence levels), all of one rows level:
//   rows level R   T rounded up to a multiple of max(128, pow2floor(T) / 2): two per octave (less
//                  than 50% over T); a run at one seq_len has one (a micro-batch's rows are
//                  fixed), the vision tower's varying patch counts a few
//   batch level B  the non-empty documents rounded up to 8, 64, 512 or 4096; the rest are padding
//                  sequences of one token each, on zero rows past the last token (their output
//                  is exactly zero). More than 4096 documents: not a cuDNN problem (own kernel)
//   seq level S    the longest document rounded up to P/64, P/16, P/4 or P (P = pow2ceil(R)),
//                  at least 128
//   max_total      R + B + kTileSlack rounded up to 128: every row the backward can address
//                  (tokens, padding sequences, a tile past the end), whatever T is in the level
constexpr int64_t kBatchLevels[] = {8, 64, 512, 4096};
int64_t rows_level(int64_t tokens);
int64_t batch_level(int64_t docs);                   // 0 when docs > 4096
std::vector<int64_t> seq_levels(int64_t rows_level); // ascending, at most 4
int64_t seq_level(int64_t longest, int64_t rows_level);
int64_t backward_total(int64_t rows_level, int64_t batch_level);

// One graph size of a rows level: what plan_key() takes from a layout.
struct SizeClass {
  int64_t rows = 0, batch = 0, max_seq = 0;
  bool operator==(const SizeClass&) const = default;
};
// Every size class a problem of `rows_level` can fall in (each has a problem: size_class_lengths
// finds one); at most 16.
std::vector<SizeClass> size_classes(int64_t rows_level);
// Document lengths of the cheapest problem of `c` (fewest tokens, shortest longest document; an
// empty document first, the lengths 1, 17, 127 and 192 among them where they fit, the last one
// at least 2 tokens), for the self-check of the class's plans. Empty when `c` has no
// problem.
std::vector<int32_t> size_class_lengths(const SizeClass& c);

// --- the ragged layout and the plan cache's key -----------------------------------------------

struct RaggedLayout {
  int64_t batch = 0;     // the graph's B: the batch level (0: more documents than the last level)
  int64_t docs = 0;      // non-empty documents (an empty one has nothing to attend to)
  int64_t max_seq = 0;   // the graph's S: the seq level of the longest document
  int64_t rows = 0;      // the rows level of the tokens
  int64_t max_total = 0; // the backward's max_total_seq_len: backward_total(rows, batch)
  // Rows every buffer holds past the tokens: one per padding sequence, then kTileSlack.
  int64_t spare_rows = 0;
  std::vector<int32_t> seq_len;      // [batch] tokens of each sequence (1 for padding ones)
  std::vector<int64_t> q_offset;     // [batch + 1] elements: first row × Hq·D (Q, O, dO, dQ)
  std::vector<int64_t> kv_offset;    // [batch + 1] elements: first row × Hkv·D (K, V, dK, dV)
  std::vector<int64_t> stats_offset; // [batch + 1] elements: first row × Hq (the LSE)
  SizeClass size_class() const { return {rows, batch, max_seq}; }
};
// From the B + 1 host offsets of `shape` (checked by the caller). Offsets are int64: row × row size
// overflows int32 past 2^31 elements.
RaggedLayout ragged_layout(const int32_t* cu_seqlens, const AttentionShape& shape);

// Everything a built graph bakes in: two problems with equal keys may share a plan; any
// difference needs its own (FlashInfer once replayed a graph built for another layout because
// its key lacked the strides). Strides follow from the heads and head dim (packed rows).
struct PlanKey {
  int sm = 0;
  int64_t batch = 0, max_seq = 0, max_total = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = true;
  bool deterministic = false;
  float scale = 0.f; // baked with set_attn_scale(float)
  bool operator==(const PlanKey&) const = default;
  std::string str() const; // "sm90 B8 S256 T1280 Hq16 Hkv8 D128 causal nondet scale=0.0883883"
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const;
};
PlanKey plan_key(const AttentionShape& shape, const SizeClass& size, int sm, bool deterministic);

// The configuration's key: what can make cuDNN right or wrong on one machine apart from the sizes
// (sm, library versions, heads, head dim, mask, determinism).
std::string check_key(const Capability& cap, const AttentionShape& shape, bool deterministic);

// --- determinism and the backward's workspace ---------------------------------------------------

// Whether the backward runs cuDNN's deterministic algorithm (a fixed dQ summation order), and the
// most workspace one attention call may take. The non-deterministic backward is the default: its
// workspace is one fp32 dQ accumulator (max_total·Hq·D·4 bytes); the deterministic one keeps dQ
// partials per key tile, ~B·Hq·S²·4 bytes (8.6 GB for one 4k document padded to 8 sequences of 16
// heads), so a key whose deterministic workspace is over the limit runs the non-deterministic plan,
// said in the log once. The training step sets these from training.deterministic_attention and
// training.attention_workspace_gb (VLM_ATTENTION_DETERMINISTIC=0|1 overrides the first), the
// trainer build_whole_set.
struct Settings {
  bool deterministic = false;
  int64_t workspace_limit = int64_t(4) << 30; // bytes
  // Build and self-check every size class of the first rows level a configuration meets, at its
  // first call (the trainer: its forward before the first step builds all the text model's plans,
  // no step builds one of them); other levels' plans, and all plans without it (tests,
  // benchmarks), at their own first call.
  bool build_whole_set = false;
};
void set_settings(const Settings& s);
Settings settings();
bool deterministic_requested(); // settings().deterministic unless VLM_ATTENTION_DETERMINISTIC
// The estimate above, before a plan exists; the plan's own size decides once it is built.
int64_t deterministic_workspace_estimate(const PlanKey& key);
// Whether `key` may run deterministically: its workspace (the plan's, or the estimate when
// `plan_bytes` < 0) within `limit`.
bool deterministic_fits(const PlanKey& key, int64_t plan_bytes, int64_t limit);

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
// plus the layout's spare_rows (inputs' spare rows zero; O's and Stats' zeroed before a backward
// reads them): out, q [T, Hq, D]; k, v [T, Hkv, D]; lse [T, Hq] fp32; the backward's dq, dk, dv
// overwritten. `ragged` holds the layout's seq_len and offsets
// on the device, packed as ragged_device_bytes() lays them out. Returns "" when cuDNN ran, else
// why not (a graph it cannot build or plan: the caller falls back); a wrong graph of ours throws.
std::string sdpa_fwd(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                     const void* ragged, const PlanKey& key, void* stream);
std::string sdpa_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                     const bf16* v, const bf16* out, const float* lse, const void* ragged,
                     const PlanKey& key, void* stream);
// Builds the forward and backward plans of `key` now (a no-op when built): "" or why cuDNN cannot
// plan them. `workspace` gets the backward plan's workspace bytes.
std::string build_plans(const PlanKey& key, int64_t& workspace);
// Plans built in this process (forward and backward count one each).
int64_t plans_built();

} // namespace cuda

// The layout's device image: seq_len (int32, padded to 8 bytes), then q_offset, kv_offset and
// stats_offset (int64); uploaded once per batch and configuration (src/core/varlen.h keeps it),
// read by every layer's forward and backward.
std::vector<uint8_t> ragged_device_bytes(const RaggedLayout& layout);
// What the image depends on beyond the offsets (heads, head dim): the name a batch's cache keeps
// it under, "cuDNN ragged Hq16 Hkv8 D128".
std::string ragged_image_key(const AttentionShape& shape);
struct RaggedParts { // byte offsets of the four arrays in that image
  size_t seq_len = 0, q_offset = 0, kv_offset = 0, stats_offset = 0;
};
RaggedParts ragged_parts(int64_t batch);

} // namespace vlm::kernels::cudnn_attention
