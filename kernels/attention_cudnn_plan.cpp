// Host logic of the cuDNN attention (kernels/attention_cudnn.h): which backend runs, the ragged
// layout cuDNN reads, and the keys its plans and self-checks are cached under. No CUDA here:
// every build has it and the CPU tests check it.
#include "kernels/attention_cudnn.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <optional>
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

namespace {
Settings& settings_store() {
  static Settings s;
  return s;
}
} // namespace

void set_settings(const Settings& s) {
  VLM_CHECK(s.workspace_limit > 0, "cuDNN attention: the workspace limit must be > 0 bytes, got ",
            s.workspace_limit);
  settings_store() = s;
}
Settings settings() { return settings_store(); }

bool deterministic_requested() {
  const int64_t v = env_int("VLM_ATTENTION_DETERMINISTIC", settings().deterministic ? 1 : 0);
  VLM_CHECK(v == 0 || v == 1, "VLM_ATTENTION_DETERMINISTIC: expected 0 or 1, got ", v);
  return v == 1;
}

int64_t deterministic_workspace_estimate(const PlanKey& key) {
  return key.batch * key.q_heads * key.max_seq * key.max_seq * int64_t(sizeof(float));
}

bool deterministic_fits(const PlanKey& key, int64_t plan_bytes, int64_t limit) {
  return (plan_bytes >= 0 ? plan_bytes : deterministic_workspace_estimate(key)) <= limit;
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

namespace {

int64_t pow2ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}
int64_t pow2floor(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
// The rounding step of the rows levels in T's octave: two levels per octave (at most 50% over T),
// so the vision tower's varying patch counts meet few; at least 128.
int64_t rows_step(int64_t tokens) { return std::max<int64_t>(128, pow2floor(tokens) / 2); }

} // namespace

int64_t rows_level(int64_t tokens) {
  const int64_t t = std::max<int64_t>(tokens, 1);
  return round_up(t, rows_step(t));
}

int64_t batch_level(int64_t docs) {
  for (int64_t level : kBatchLevels)
    if (docs <= level) return level;
  return 0;
}

std::vector<int64_t> seq_levels(int64_t rows) {
  const int64_t p = pow2ceil(rows_level(rows));
  std::vector<int64_t> levels;
  for (int64_t level : {p / 64, p / 16, p / 4, p}) {
    level = std::max<int64_t>(level, 128);
    if (levels.empty() || levels.back() != level) levels.push_back(level);
  }
  return levels;
}

int64_t seq_level(int64_t longest, int64_t rows) {
  for (int64_t level : seq_levels(rows))
    if (longest <= level) return level;
  VLM_FAIL("cuDNN attention: a document of ", longest, " tokens in a rows level of ", rows);
}

int64_t backward_total(int64_t rows, int64_t batch) {
  return round_up(rows + batch + kTileSlack, 128);
}

namespace {

// The smallest token count whose rows level is `rows` (a level: rows_level(rows) == rows): the
// step of the octave below `rows` (rows - 1's) reaches back from it.
int64_t fewest_tokens(int64_t rows) { return std::max<int64_t>(1, rows - rows_step(rows - 1) + 1); }

// The level below `level` in `levels` (0 for the first).
int64_t below(const std::vector<int64_t>& levels, int64_t level) {
  int64_t prev = 0;
  for (int64_t l : levels) {
    if (l == level) return prev;
    prev = l;
  }
  VLM_FAIL("cuDNN attention: ", level, " is not a level");
}

struct Problem {
  int64_t docs = 0, longest = 0, tokens = 0;
};

// The cheapest problem of `c`: fewest documents, then the shortest longest one and fewest tokens.
// docs in (B_prev, B], longest in (S_prev, S], tokens in [fewest_tokens(R), R], each document
// 1..longest tokens: docs - 1 + longest <= tokens <= docs · longest.
std::optional<Problem> cheapest_problem(const SizeClass& c) {
  const std::vector<int64_t> batches(std::begin(kBatchLevels), std::end(kBatchLevels));
  const int64_t t_min = fewest_tokens(c.rows);
  for (int64_t n = below(batches, c.batch) + 1; n <= c.batch; n++) {
    const int64_t longest = std::max(below(seq_levels(c.rows), c.max_seq) + 1, (t_min + n - 1) / n);
    if (longest > c.max_seq) continue;
    const int64_t tokens = std::max(t_min, n - 1 + longest);
    if (tokens <= c.rows && tokens <= n * longest) return Problem{n, longest, tokens};
  }
  return std::nullopt;
}

} // namespace

std::vector<SizeClass> size_classes(int64_t rows) {
  VLM_CHECK(rows_level(rows) == rows, "cuDNN attention: ", rows, " is not a rows level");
  std::vector<SizeClass> out;
  for (int64_t b : kBatchLevels)
    for (int64_t s : seq_levels(rows))
      if (cheapest_problem({rows, b, s})) out.push_back({rows, b, s});
  return out;
}

std::vector<int32_t> size_class_lengths(const SizeClass& c) {
  const std::optional<Problem> p = cheapest_problem(c);
  if (!p) return {};
  std::vector<int32_t> lengths = {0, int32_t(p->longest)}; // an empty one, then the longest
  int64_t docs = p->docs - 1, tokens = p->tokens - p->longest;
  // Lengths that have found cuDNN bugs (one token, odd, one short of a tile, 64 mod 128), where
  // the documents after them can still hold the tokens left.
  for (int64_t len : {1, 17, 127, 192}) {
    if (docs <= 1 || len > p->longest) continue;
    if (tokens - len >= docs - 1 && tokens - len <= (docs - 1) * p->longest) {
      lengths.push_back(int32_t(len));
      docs--;
      tokens -= len;
    }
  }
  for (int64_t i = 0; i < docs; i++) { // the rest as even as they come
    const int64_t len = tokens / (docs - i);
    lengths.push_back(int32_t(len));
    tokens -= len;
  }
  // The last document holds the self-check's low-LSE pattern: at least 2 tokens where possible.
  if (lengths.back() < 2) std::swap(lengths.back(), lengths[1]);
  return lengths;
}

RaggedLayout ragged_layout(const int32_t* cu_seqlens, const AttentionShape& shape) {
  RaggedLayout l;
  const int64_t q_row = shape.q_heads * shape.head_dim;
  const int64_t kv_row = shape.kv_heads * shape.head_dim;
  const int64_t T = shape.tokens;
  int64_t longest = 0;
  auto add = [&](int64_t first, int64_t len) {
    l.seq_len.push_back(int32_t(len));
    l.q_offset.push_back(first * q_row);
    l.kv_offset.push_back(first * kv_row);
    l.stats_offset.push_back(first * shape.q_heads);
  };
  for (int64_t b = 0; b < shape.docs; b++) {
    const int64_t start = cu_seqlens[b], len = cu_seqlens[b + 1] - cu_seqlens[b];
    if (len == 0) continue;
    add(start, len);
    longest = std::max(longest, len);
  }
  l.docs = int64_t(l.seq_len.size());
  l.rows = rows_level(T);
  l.batch = batch_level(std::max<int64_t>(l.docs, 1));
  if (l.batch == 0) return l; // too many documents for one graph: the caller runs the own kernel
  // Padding sequences of one token on the zero rows after the tokens: exact zeros out, and no
  // zero-length sequence (handled right only from cuDNN 9.25).
  const int64_t padding = l.batch - l.docs;
  for (int64_t i = 0; i < padding; i++) add(T + i, 1);
  l.q_offset.push_back((T + padding) * q_row);
  l.kv_offset.push_back((T + padding) * kv_row);
  l.stats_offset.push_back((T + padding) * shape.q_heads);
  l.max_seq = seq_level(std::max<int64_t>(longest, 1), l.rows);
  l.max_total = backward_total(l.rows, l.batch);
  l.spare_rows = padding + kTileSlack;
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

PlanKey plan_key(const AttentionShape& shape, const SizeClass& size, int sm, bool deterministic) {
  PlanKey k;
  k.sm = sm;
  k.batch = size.batch;
  k.max_seq = size.max_seq;
  k.max_total = backward_total(size.rows, size.batch);
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

std::string ragged_image_key(const AttentionShape& shape) {
  std::ostringstream s;
  s << "cuDNN ragged Hq" << shape.q_heads << " Hkv" << shape.kv_heads << " D" << shape.head_dim;
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
std::string build_plans(const PlanKey&, int64_t&) { return kNoCuda; }
int64_t plans_built() { return 0; }
} // namespace cuda
#endif

} // namespace vlm::kernels::cudnn_attention
