// Host logic of the cuDNN attention (kernels/attention_cudnn.h): which backend runs, the ragged
// layout cuDNN reads, and the keys its plans and self-checks are cached under. No CUDA here:
// every build has it and the CPU tests check it.
#include "kernels/attention_cudnn.h"

#include <cstring>
#include <sstream>

#include "src/base/check.h"
#include "src/base/env.h"

namespace vlm::kernels::cudnn_attention {

namespace {

constexpr int64_t version(int major, int minor, int patch) {
  return major * 10000 + minor * 100 + patch; // CUDNN_VERSION's encoding from cuDNN 9 on
}

} // namespace

std::string version_text(int64_t v) {
  std::ostringstream s;
  s << v / 10000 << '.' << v / 100 % 100 << '.' << v % 100;
  return s.str();
}

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

Choice own(std::string reason) { return {Backend::own_kernel, std::move(reason)}; }

} // namespace

Request requested_backend() {
  const std::string v = env_str("VLM_ATTENTION_BACKEND", "auto");
  if (v == "auto") return Request::automatic;
  if (v == "cudnn") return Request::cudnn;
  if (v == "own") return Request::own_kernel;
  VLM_FAIL("VLM_ATTENTION_BACKEND: expected auto, cudnn or own, got '", v, "'");
}

const char* backend_name(Backend b) {
  return b == Backend::cudnn ? "cuDNN fused attention" : "own flash-style kernel";
}

bool deterministic_requested() {
  const int64_t v = env_int("VLM_ATTENTION_DETERMINISTIC", 1);
  VLM_CHECK(v == 0 || v == 1, "VLM_ATTENTION_DETERMINISTIC: expected 0 or 1, got ", v);
  return v == 1;
}

Choice choose_backend(const Capability& cap, const AttentionShape& shape, DType dtype,
                      Request request) {
  if (request == Request::own_kernel) return own("VLM_ATTENTION_BACKEND=own");
  if (!cap.frontend_built)
    return own(
        "this build has no cuDNN frontend (tools/deps/fetch_cudnn_frontend.sh, then rebuild)");
  if (cap.cudnn_version <= 0) return own("no cuDNN library loaded");
  if (dtype != DType::bf16)
    return own(std::string("cuDNN attention runs bf16, not ") + dtype_name(dtype));
  const int64_t v = cap.cudnn_version;
  const int64_t d = shape.head_dim;
  const std::string at = " (cuDNN " + version_text(v) + ", sm_" + std::to_string(cap.sm) + ")";
  if (cap.sm < 80) return own("cuDNN attention needs sm_80 or newer" + at);
  if (v < version(9, 6, 0))
    return own("cuDNN older than 9.6 (int64 ragged offsets, ragged GQA backward)" + at);
  if (v == version(9, 10, 0) || v == version(9, 10, 1))
    return own("cuDNN 9.10.0/9.10.1 attention is refused by the frontend" + at);
  if (d % 8 != 0) return own("head dim " + std::to_string(d) + " is not a multiple of 8" + at);
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0)
    return own("query heads not a multiple of kv heads" + at);
  if (cap.sm >= 80 && cap.sm < 90) {
    if (d > 128) return own("head dim " + std::to_string(d) + " > 128 in the backward" + at);
    if (v < version(9, 18, 1)) return own("ragged attention on sm_8x needs cuDNN 9.18.1" + at);
  } else if (cap.sm == 90) {
    if (d > 256) return own("head dim " + std::to_string(d) + " > 256" + at);
    if (d > 128 && v >= version(9, 11, 0) && v < version(9, 13, 0))
      return own("cuDNN 9.11/9.12 backward is wrong for head dims > 128 on sm_90" + at);
  } else { // Blackwell and later
    const bool ok = d <= 128 || (d == 256 && v >= version(9, 23, 0));
    if (!ok) return own("head dim " + std::to_string(d) + " in the backward" + at);
  }
  return {Backend::cudnn, ""};
}

bool zero_length_supported(int64_t cudnn_version) { return cudnn_version >= version(9, 25, 0); }

RaggedLayout ragged_layout(const int32_t* cu_seqlens, const AttentionShape& shape, bool pad_batch) {
  RaggedLayout l;
  const int64_t q_row = shape.q_heads * shape.head_dim;
  const int64_t kv_row = shape.kv_heads * shape.head_dim;
  int64_t longest = 0;
  for (int64_t b = 0; b < shape.docs; b++) {
    const int64_t start = cu_seqlens[b], len = cu_seqlens[b + 1] - cu_seqlens[b];
    if (len == 0) continue;
    l.seq_len.push_back(int32_t(len));
    l.q_offset.push_back(start * q_row);
    l.kv_offset.push_back(start * kv_row);
    l.stats_offset.push_back(start * shape.q_heads);
    longest = std::max(longest, len);
  }
  l.batch = int64_t(l.seq_len.size());
  // At least one sequence: a graph with B = 0 is not a graph (an all-empty batch then runs one
  // zero-length sequence, or the caller skips cuDNN; see the op).
  const int64_t batch = pad_batch ? round_up(std::max<int64_t>(l.batch, 1), 8) : l.batch;
  const int64_t end = shape.tokens;
  while (int64_t(l.seq_len.size()) < batch) { // zero-length sequences at the end of the rows
    l.seq_len.push_back(0);
    l.q_offset.push_back(end * q_row);
    l.kv_offset.push_back(end * kv_row);
    l.stats_offset.push_back(end * shape.q_heads);
  }
  l.batch = batch;
  l.q_offset.push_back(end * q_row);
  l.kv_offset.push_back(end * kv_row);
  l.stats_offset.push_back(end * shape.q_heads);
  l.max_seq = round_up(std::max<int64_t>(longest, 1), 128);
  l.max_total = round_up(std::max<int64_t>(shape.tokens, 1), 1024);
  return l;
}

std::string PlanKey::str() const {
  std::ostringstream s;
  s << "sm" << sm << " B" << batch << " S" << max_seq << " T" << max_total << " Hq" << q_heads
    << " Hkv" << kv_heads << " D" << head_dim << (causal ? " causal" : " bidirectional")
    << (deterministic ? " det" : " nondet") << " scale=" << scale;
  return s.str();
}

size_t PlanKeyHash::operator()(const PlanKey& k) const {
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &k.scale, sizeof scale_bits);
  size_t h = 1469598103934665603ull;
  for (int64_t x : {int64_t(k.sm), k.batch, k.max_seq, k.max_total, k.q_heads, k.kv_heads,
                    k.head_dim, int64_t(k.causal), int64_t(k.deterministic), int64_t(scale_bits)})
    h = (h ^ size_t(x)) * 1099511628211ull;
  return h;
}

PlanKey plan_key(const AttentionShape& shape, const RaggedLayout& layout, int sm,
                 bool deterministic) {
  PlanKey k;
  k.sm = sm;
  k.batch = layout.batch;
  k.max_seq = layout.max_seq;
  k.max_total = layout.max_total;
  k.q_heads = shape.q_heads;
  k.kv_heads = shape.kv_heads;
  k.head_dim = shape.head_dim;
  k.causal = shape.causal;
  k.deterministic = deterministic;
  k.scale = float(shape.scale);
  return k;
}

std::string check_key(const Capability& cap, const AttentionShape& shape, bool deterministic) {
  std::ostringstream s;
  s << "cudnn attention sm" << cap.sm << " cudnn " << version_text(cap.cudnn_version) << " Hq"
    << shape.q_heads << " Hkv" << shape.kv_heads << " D" << shape.head_dim
    << (shape.causal ? " causal" : " bidirectional") << (deterministic ? " det" : " nondet");
  return s.str();
}

RaggedParts ragged_parts(int64_t batch) {
  RaggedParts p;
  p.seq_len = 0;
  p.q_offset = size_t(round_up(batch * int64_t(sizeof(int32_t)), 16));
  p.kv_offset = p.q_offset + size_t(batch + 1) * sizeof(int64_t);
  p.stats_offset = p.kv_offset + size_t(batch + 1) * sizeof(int64_t);
  return p;
}

std::vector<uint8_t> ragged_device_bytes(const RaggedLayout& layout) {
  const RaggedParts p = ragged_parts(layout.batch);
  const size_t n = size_t(layout.batch + 1) * sizeof(int64_t);
  std::vector<uint8_t> bytes(p.stats_offset + n, 0);
  std::memcpy(bytes.data() + p.seq_len, layout.seq_len.data(),
              layout.seq_len.size() * sizeof(int32_t));
  std::memcpy(bytes.data() + p.q_offset, layout.q_offset.data(), n);
  std::memcpy(bytes.data() + p.kv_offset, layout.kv_offset.data(), n);
  std::memcpy(bytes.data() + p.stats_offset, layout.stats_offset.data(), n);
  return bytes;
}

std::string ragged_image_key(const AttentionShape& shape, bool pad_batch) {
  std::ostringstream s;
  s << "cuDNN ragged Hq" << shape.q_heads << " Hkv" << shape.kv_heads << " D" << shape.head_dim
    << (pad_batch ? " padded" : "");
  return s.str();
}

#if !VLM_WITH_CUDA
// The graph code's entry points in a build without the CUDA backend (kernels/cuda is not built):
// nothing to run; the op never reaches the two that would need a device.
namespace cuda {
namespace {
const char* kNoCuda = "this build has no CUDA backend (configure with -DVLM_CUDA=ON)";
}
bool frontend_built() { return false; }
std::string frontend_version() { return "not built"; }
int64_t cudnn_version() { return 0; }
Capability capability(int) { VLM_FAIL("cuDNN attention: ", kNoCuda); }
std::string validate_graphs(const PlanKey&) { return kNoCuda; }
std::string sdpa_fwd(bf16*, float*, const bf16*, const bf16*, const bf16*, const void*,
                     const PlanKey&, void*) {
  VLM_FAIL("cuDNN attention: ", kNoCuda);
}
std::string sdpa_bwd(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                     const bf16*, const float*, const void*, const PlanKey&, void*) {
  VLM_FAIL("cuDNN attention: ", kNoCuda);
}
} // namespace cuda
#endif

} // namespace vlm::kernels::cudnn_attention
