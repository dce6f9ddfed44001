#include "src/core/ops/attention_cudnn.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "kernels/gpu_runtime.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/base/rng.h"
#include "src/core/ops/self_check.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/stream.h"

namespace vlm::ops_detail {

using cudnn_attention::Backend;
using cudnn_attention::Request;

Tensor first_rows(const Tensor& t, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  return t.as_strided(shape, t.strides(), t.offset());
}

namespace {

std::atomic<int64_t> g_runs{0};

std::mutex& decisions_mutex() {
  static std::mutex m;
  return m;
}

// Relative L2 error of `got` against `want` over their first `n` values (Inf when a value is not
// finite or the norm of `want` is 0 while `got` differs).
double rel_l2(const std::vector<double>& got, const std::vector<double>& want, size_t n) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; i++) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    ref += want[i] * want[i];
  }
  return ref > 0 ? std::sqrt(diff / ref) : (diff > 0 ? INFINITY : 0);
}

// Zeroes the rows of `p` ([rows + spare, ...], contiguous) from `rows` on, on the current stream.
void zero_rows_from(const Tensor& p, int64_t rows) {
  const int64_t row = p.numel() / std::max<int64_t>(p.size(0), 1);
  const int64_t spare = p.size(0) - rows;
  kernels::cuda::memset_async(
      static_cast<uint8_t*>(p.data_ptr()) + size_t(rows * row) * p.element_size(), 0,
      size_t(spare * row) * p.element_size(), current_stream(p.device()).handle());
}

// A [rows + spare, heads, D] copy of x ([rows, heads, D], contiguous) with zero spare rows: what
// cuDNN reads.
Tensor padded_copy(const Tensor& x, int64_t spare) {
  const int64_t rows = x.size(0);
  Shape shape = x.shape();
  shape[0] = rows + spare;
  Tensor p = Tensor::empty(shape, x.dtype(), x.device());
  zero_rows_from(p, rows);
  Tensor head = first_rows(p, rows);
  copy_(head, x);
  return p;
}

Tensor padded_empty(const Shape& rows_shape, int64_t spare, DType dtype, Device device) {
  Shape shape = rows_shape;
  shape[0] += spare;
  return Tensor::empty(shape, dtype, device);
}

template <typename T> T* ptr(const Tensor& t) { return t.data<T>(); }

// The ragged layout's device image for `shape`, kept by the batch's layout: uploaded (from pinned
// memory) by the first layer that needs it, read by the others and by every backward.
Tensor ragged_image(const VarlenLayout& varlen, const cudnn_attention::RaggedLayout& layout,
                    const kernels::AttentionShape& shape, Device device) {
  return varlen.device_image(device, cudnn_attention::ragged_image_key(shape),
                             [&] { return cudnn_attention::ragged_device_bytes(layout); });
}

// The forward as the op runs it: out and lse ([T + spare, ...]) written, then their spare rows
// zeroed (cuDNN may leave anything there; the backward reads them). "" or why cuDNN cannot run.
std::string forward_into(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& ragged, const cudnn_attention::PlanKey& key,
                         int64_t tokens) {
  const std::string why = cudnn_attention::cuda::sdpa_fwd(
      out.data<bf16>(), lse.data<float>(), q.data<bf16>(), k.data<bf16>(), v.data<bf16>(),
      ragged.data_ptr(), key, current_stream(out.device()).handle());
  if (why.empty()) {
    zero_rows_from(out, tokens);
    zero_rows_from(lse, tokens);
  }
  return why;
}

} // namespace

std::string check_name(const cudnn_attention::Capability& cap,
                       const cudnn_attention::PlanKey& key) {
  return "cudnn attention " + cudnn_attention::version_text(cap.cudnn_version) + " " + key.str();
}

Backend decide_attention_backend(const cudnn_attention::Capability& cap,
                                 const kernels::AttentionShape& shape, DType dtype, Request request,
                                 const cudnn_attention::PlanKey& plan,
                                 const std::function<AttentionProbe()>& probe,
                                 const std::function<void(const std::string&)>& log) {
  const cudnn_attention::Choice choice =
      cudnn_attention::choose_backend(cap, shape, dtype, request);
  const std::string config = cudnn_attention::check_key(cap, shape, plan.deterministic);
  const std::string key = check_name(cap, plan);
  std::lock_guard<std::mutex> lock(decisions_mutex());
  // Per key and request (a test may ask for the own kernel, then for cuDNN). A decision that
  // throws is not kept: the next call throws again.
  static std::map<std::pair<std::string, Request>, Backend> decisions;
  // An unsupported configuration is said once, not once per size class.
  static std::set<std::string> said_unsupported;
  const auto id = std::pair(key, request);
  if (auto it = decisions.find(id); it != decisions.end()) return it->second;
  if (choice.backend == Backend::own_kernel) {
    VLM_CHECK(request != Request::cudnn, "VLM_ATTENTION_BACKEND=cudnn, but cuDNN cannot run ",
              config, ": ", choice.reason);
    // A choice by request, or by dtype (f32 runs the own kernel by design), is not news.
    if (request != Request::own_kernel && dtype == DType::bf16 &&
        said_unsupported.insert(config).second)
      log("attention: " + config + ": the own kernel runs (" + choice.reason + ")");
    return decisions[id] = Backend::own_kernel;
  }
  // Why cuDNN cannot build or plan a key's graphs (the self-check's own cache keeps only
  // pass/fail).
  static std::map<std::string, std::string> cannot_run;
  const bool passes = gpu_kernel_passes(
      key, kAttentionSelfCheckTolerance,
      [&] {
        AttentionProbe p = probe();
        if (p.unsupported.empty()) return p.error;
        cannot_run[key] = p.unsupported;
        return 0.0;
      },
      "the own attention kernel");
  if (auto it = cannot_run.find(key); it != cannot_run.end()) {
    VLM_CHECK(request != Request::cudnn, "VLM_ATTENTION_BACKEND=cudnn, but cuDNN cannot run ", key,
              ": ", it->second);
    log("attention: " + key + ": cuDNN cannot run it here (" + it->second +
        "); the own kernel runs");
    return decisions[id] = Backend::own_kernel;
  }
  VLM_CHECK(passes || request != Request::cudnn, "VLM_ATTENTION_BACKEND=cudnn, but ", key,
            " failed its self-check (see the line above)");
  return decisions[id] = passes ? Backend::cudnn : Backend::own_kernel;
}

AttentionProbe probe_cudnn_attention(const kernels::AttentionShape& production,
                                     const cudnn_attention::SizeClass& size, bool deterministic,
                                     Device device) {
#if !VLM_WITH_CUDA
  (void)production, (void)size, (void)deterministic, (void)device;
  return {0, "this build has no CUDA backend"};
#else
  const cudnn_attention::Capability cap = cudnn_attention::cuda::capability(device.index);
  const std::vector<int32_t> lengths = cudnn_attention::size_class_lengths(size);
  VLM_CHECK(!lengths.empty(), "cuDNN attention self-check: no problem has the size class rows ",
            size.rows, " B", size.batch, " S", size.max_seq);
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  kernels::AttentionShape s = production;
  s.tokens = cu.back();
  s.docs = int64_t(lengths.size());
  const int64_t T = s.tokens, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;

  Rng rng(20261206);
  auto randn = [&](int64_t heads) { return Tensor::randn({T, heads, D}, rng, DType::f32); };
  Tensor q = randn(Hq), k = randn(Hkv), v = randn(Hkv), dout = randn(Hq);
  { // The last non-empty document: every key the same vector u and every query -c·u, so each
    // scaled score is about -100 and its row's LSE about -100 + ln(n) < -88.7.
    size_t last = cu.size() - 2;
    while (cu[last + 1] == cu[last]) last--;
    const int64_t first = cu[last], end = cu[last + 1];
    float* qd = q.data<float>();
    float* kd = k.data<float>();
    double norm2 = 0;
    for (int64_t d = 0; d < D; d++)
      norm2 += double(kd[first * Hkv * D + d]) * kd[first * Hkv * D + d];
    const double c = 100.0 / (s.scale * norm2);
    for (int64_t t = first; t < end; t++)
      for (int64_t d = 0; d < D; d++) {
        const float u = kd[first * Hkv * D + d];
        for (int64_t h = 0; h < Hkv; h++) kd[(t * Hkv + h) * D + d] = u;
        for (int64_t h = 0; h < Hq; h++) qd[(t * Hq + h) * D + d] = float(-c * u);
      }
  }
  auto to_dev = [&](const Tensor& x) { return x.to(DType::bf16).to(device); };
  Tensor qd = to_dev(q), kd = to_dev(k), vd = to_dev(v), dod = to_dev(dout);
  void* stream = current_stream(device).handle();

  // The reference: the own kernels' slow exact-order version.
  const VarlenLayout varlen =
      VarlenLayout::of(Tensor::from_vector<int32_t>(cu, {int64_t(cu.size())}), s.tokens);
  const int32_t* cu_dev = varlen.device_offsets(device).cu_seqlens;
  Tensor ro = Tensor::full({T, Hq, D}, NAN, DType::bf16, device);
  Tensor rl = Tensor::full({T, Hq}, NAN, DType::f32, device);
  Tensor rdq = Tensor::full({T, Hq, D}, NAN, DType::bf16, device);
  Tensor rdk = Tensor::full({T, Hkv, D}, NAN, DType::bf16, device);
  Tensor rdv = Tensor::full({T, Hkv, D}, NAN, DType::bf16, device);
  kernels::cuda::attention_ref_fwd<bf16>(ptr<bf16>(ro), ptr<float>(rl), ptr<bf16>(qd),
                                         ptr<bf16>(kd), ptr<bf16>(vd), cu_dev, s, stream);
  kernels::cuda::attention_ref_bwd<bf16>(
      ptr<bf16>(rdq), ptr<bf16>(rdk), ptr<bf16>(rdv), ptr<bf16>(dod), ptr<bf16>(qd), ptr<bf16>(kd),
      ptr<bf16>(vd), ptr<bf16>(ro), ptr<float>(rl), cu_dev, s, stream);

  // cuDNN, as the op runs it, outputs NaN first (spare rows too: the forward must zero them).
  const auto layout = cudnn_attention::ragged_layout(cu.data(), s);
  VLM_CHECK(layout.size_class() == size, "cuDNN attention self-check: the problem of rows ",
            size.rows, " B", size.batch, " S", size.max_seq, " fell in rows ", layout.rows, " B",
            layout.batch, " S", layout.max_seq);
  const auto key = cudnn_attention::plan_key(s, size, cap.sm, deterministic);
  const int64_t spare = layout.spare_rows;
  Tensor ragged = ragged_image(varlen, layout, s, device);
  Tensor pq = padded_copy(qd, spare), pk = padded_copy(kd, spare), pv = padded_copy(vd, spare),
         pdo = padded_copy(dod, spare);
  auto nan_rows = [&](int64_t heads, int64_t d, DType t) {
    return Tensor::full({T + spare, heads, d}, NAN, t, device);
  };
  Tensor co = nan_rows(Hq, D, DType::bf16), cl = nan_rows(Hq, 1, DType::f32);
  AttentionProbe result;
  result.unsupported = forward_into(co, cl, pq, pk, pv, ragged, key, T);
  if (!result.unsupported.empty()) return result;
  std::vector<double> grads[2][3];
  for (int run = 0; run < (deterministic ? 2 : 1); run++) {
    Tensor dq = nan_rows(Hq, D, DType::bf16), dk = nan_rows(Hkv, D, DType::bf16),
           dv = nan_rows(Hkv, D, DType::bf16);
    result.unsupported = cudnn_attention::cuda::sdpa_bwd(
        ptr<bf16>(dq), ptr<bf16>(dk), ptr<bf16>(dv), ptr<bf16>(pdo), ptr<bf16>(pq), ptr<bf16>(pk),
        ptr<bf16>(pv), ptr<bf16>(co), ptr<float>(cl), ragged.data_ptr(), key, stream);
    if (!result.unsupported.empty()) return result;
    grads[run][0] = first_rows(dq, T).to_doubles();
    grads[run][1] = first_rows(dk, T).to_doubles();
    grads[run][2] = first_rows(dv, T).to_doubles();
  }
  if (deterministic)
    for (int g = 0; g < 3; g++)
      VLM_CHECK(grads[0][g] == grads[1][g], "cuDNN's deterministic backward gave two different ",
                "d", "QKV"[g], " on the same inputs (", key.str(), ")");

  // Valid rows only: spare rows are undefined. Every output row of a non-empty document counts.
  const std::vector<double> want_lse = rl.to_doubles(), got_lse = first_rows(cl, T).to_doubles();
  double err = 0;
  for (size_t i = 0; i < want_lse.size(); i++) {
    const double e = std::abs(got_lse[i] - want_lse[i]) / std::max(1.0, std::abs(want_lse[i]));
    err = std::max(err, std::isfinite(e) ? e : INFINITY);
  }
  auto compare = [&](const Tensor& ref, const std::vector<double>& got) {
    const std::vector<double> want = ref.to_doubles();
    VLM_CHECK(want.size() == got.size() && !want.empty(), "attention self-check: compared ",
              got.size(), " values against ", want.size());
    err = std::max(err, rel_l2(got, want, want.size()));
  };
  compare(ro, first_rows(co, T).to_doubles());
  compare(rdq, grads[0][0]);
  compare(rdk, grads[0][1]);
  compare(rdv, grads[0][2]);
  result.error = err;
  return result;
#endif
}

namespace {

// A plan that did not build for one production problem: said once per plan key.
void say_once(const cudnn_attention::PlanKey& key, const char* direction, const std::string& why) {
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(m);
  if (said.insert(direction + key.str()).second)
    log_warn("attention: cuDNN ", direction, " cannot run ", key.str(), " (", why,
             "); the own kernel runs it");
}

// The decision for one size class of a configuration, uncached: the key (deterministic only
// within the workspace limit), its plans built, its self-check.
std::optional<cudnn_attention::PlanKey> decide_plan(const cudnn_attention::Capability& cap,
                                                    const kernels::AttentionShape& shape,
                                                    const cudnn_attention::SizeClass& size,
                                                    Device device) {
  const cudnn_attention::Settings settings = cudnn_attention::settings();
  cudnn_attention::PlanKey key =
      cudnn_attention::plan_key(shape, size, cap.sm, cudnn_attention::deterministic_requested());
  const Request request = cudnn_attention::requested_backend();
  auto gib = [](int64_t bytes) { return double(bytes) / double(int64_t(1) << 30); };
  auto nondeterministic = [&](int64_t bytes, const char* what) {
    log_warn("attention: ", key.str(), ": the deterministic backward needs ", gib(bytes),
             " GiB of workspace per call (", what, "), over the limit of ",
             gib(settings.workspace_limit),
             " GiB (training.attention_workspace_gb): this size class runs the "
             "non-deterministic backward");
    key.deterministic = false;
  };
  if (key.deterministic && !cudnn_attention::deterministic_fits(key, -1, settings.workspace_limit))
    nondeterministic(cudnn_attention::deterministic_workspace_estimate(key), "estimated");
  if (key.deterministic &&
      cudnn_attention::choose_backend(cap, shape, DType::bf16, request).backend == Backend::cudnn) {
    int64_t workspace = 0;
    // A plan cuDNN cannot build is the self-check's to say (its probe builds it again, cached).
    if (cudnn_attention::cuda::build_plans(key, workspace).empty() &&
        !cudnn_attention::deterministic_fits(key, workspace, settings.workspace_limit))
      nondeterministic(workspace, "the built plan's");
  }
  const Backend b = decide_attention_backend(
      cap, shape, DType::bf16, request, key,
      [&] { return probe_cudnn_attention(shape, size, key.deterministic, device); },
      [](const std::string& line) { log_warn(line); });
  if (b != Backend::cudnn) return std::nullopt;
  return key;
}

} // namespace

std::optional<cudnn_attention::PlanKey> cudnn_plan_for(const kernels::AttentionShape& shape,
                                                       const cudnn_attention::SizeClass& size,
                                                       Device device) {
  using cudnn_attention::PlanKey;
  using cudnn_attention::PlanKeyHash;
  // Called by every attention forward: one capability query and one lookup. The requested key
  // (determinism as asked) names the configuration and size class exactly: max_total follows from
  // the rows and batch levels and gives the rows back.
  const cudnn_attention::Capability cap = cudnn_attention::cuda::capability(device.index);
  const bool det = cudnn_attention::deterministic_requested();
  const PlanKey wanted = cudnn_attention::plan_key(shape, size, cap.sm, det);
  // The configuration alone: the key without its sizes.
  auto config_of = [](PlanKey k) {
    k.batch = k.max_seq = k.max_total = 0;
    return k;
  };
  static std::mutex m;
  static std::map<int, std::unordered_map<PlanKey, std::optional<PlanKey>, PlanKeyHash>> devices;
  // The rows levels each configuration has met (the first one's plans built whole).
  static std::map<int, std::unordered_map<PlanKey, std::set<int64_t>, PlanKeyHash>> levels_met;
  std::lock_guard<std::mutex> lock(m);
  auto& plans = devices[device.index];
  if (auto it = plans.find(wanted); it != plans.end()) return it->second;
  if (cudnn_attention::settings().build_whole_set) {
    const std::string config = cudnn_attention::check_key(cap, shape, det);
    std::set<int64_t>& levels = levels_met[device.index][config_of(wanted)];
    if (levels.empty()) { // the whole set of this rows level, now
      levels.insert(size.rows);
      const std::vector<cudnn_attention::SizeClass> all = cudnn_attention::size_classes(size.rows);
      const int64_t before = cudnn_attention::cuda::plans_built();
      const auto t0 = std::chrono::steady_clock::now();
      for (const cudnn_attention::SizeClass& c : all)
        plans.emplace(cudnn_attention::plan_key(shape, c, cap.sm, det),
                      decide_plan(cap, shape, c, device));
      log_info("attention: ", config, ", rows level ", size.rows, ": ", all.size(),
               " size classes, ", cudnn_attention::cuda::plans_built() - before,
               " cuDNN plans built and checked in ",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
      return plans.at(wanted);
    }
    if (levels.insert(size.rows).second)
      log_info("attention: ", config, ": rows level ", size.rows, " (besides ", *levels.begin(),
               "): its plans are built as they come");
  }
  return plans.emplace(wanted, decide_plan(cap, shape, size, device)).first->second;
}

std::optional<CudnnAttentionSaved> cudnn_attention_forward(const Tensor& q, const Tensor& k,
                                                           const Tensor& v,
                                                           const VarlenLayout& varlen,
                                                           const kernels::AttentionShape& shape) {
  const Device device = q.device();
  if (!device.is_cuda() || q.dtype() != DType::bf16 || shape.tokens == 0) return std::nullopt;
  const auto layout = cudnn_attention::ragged_layout(varlen.cu_seqlens.data<int32_t>(), shape);
  if (layout.batch == 0) { // more documents than the largest batch level
    static std::once_flag said;
    std::call_once(said, [&] {
      log_warn("attention: a batch of ", layout.docs, " documents is more than cuDNN's largest ",
               "plan takes (", cudnn_attention::kBatchLevels[3], "): the own kernel runs it");
    });
    return std::nullopt;
  }
  const std::optional<cudnn_attention::PlanKey> key =
      cudnn_plan_for(shape, layout.size_class(), device);
  if (!key) return std::nullopt;
  CudnnAttentionSaved s;
  s.key = *key;
  s.spare_rows = layout.spare_rows;
  s.ragged = ragged_image(varlen, layout, shape, device);
  s.q = padded_copy(q, s.spare_rows);
  s.k = padded_copy(k, s.spare_rows);
  s.v = padded_copy(v, s.spare_rows);
  s.out = padded_empty(q.shape(), s.spare_rows, DType::bf16, device);
  s.lse = padded_empty({shape.tokens, shape.q_heads}, s.spare_rows, DType::f32, device);
  const std::string why = forward_into(s.out, s.lse, s.q, s.k, s.v, s.ragged, s.key, shape.tokens);
  if (!why.empty()) {
    say_once(s.key, "forward", why);
    return std::nullopt;
  }
  g_runs++;
  return s;
}

bool cudnn_attention_backward(const CudnnAttentionSaved& s, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv) {
  const int64_t T = dout.size(0);
  const Device device = dout.device();
  Tensor pdo = padded_copy(dout, s.spare_rows);
  Tensor pdq = padded_empty(dout.shape(), s.spare_rows, DType::bf16, device);
  Tensor pdk = padded_empty({T, s.key.kv_heads, s.key.head_dim}, s.spare_rows, DType::bf16, device);
  Tensor pdv = padded_empty({T, s.key.kv_heads, s.key.head_dim}, s.spare_rows, DType::bf16, device);
  const std::string why = cudnn_attention::cuda::sdpa_bwd(
      ptr<bf16>(pdq), ptr<bf16>(pdk), ptr<bf16>(pdv), ptr<bf16>(pdo), ptr<bf16>(s.q),
      ptr<bf16>(s.k), ptr<bf16>(s.v), ptr<bf16>(s.out), ptr<float>(s.lse), s.ragged.data_ptr(),
      s.key, current_stream(device).handle());
  if (!why.empty()) {
    say_once(s.key, "backward", why);
    return false;
  }
  g_runs++;
  dq = first_rows(pdq, T);
  dk = first_rows(pdk, T);
  dv = first_rows(pdv, T);
  return true;
}

int64_t cudnn_attention_runs() { return g_runs.load(); }

std::string attention_backend_summary(Device device) {
  if (!device.is_cuda()) return "attention: the CPU kernel";
  const auto cap = cudnn_attention::cuda::capability(device.index);
  kernels::AttentionShape probe_shape; // a typical configuration: what this machine can do
  probe_shape.q_heads = probe_shape.kv_heads = 1;
  probe_shape.head_dim = 128;
  const auto choice = cudnn_attention::choose_backend(cap, probe_shape, DType::bf16,
                                                      cudnn_attention::requested_backend());
  std::string s = "attention on " + device.str() + ": ";
  if (choice.backend == Backend::own_kernel)
    return s + "the own flash-style kernel (" + choice.reason + ")";
  return s + "cuDNN fused attention (cuDNN " + cudnn_attention::version_text(cap.cudnn_version) +
         ", frontend " + cudnn_attention::cuda::frontend_version() + ", sm_" +
         std::to_string(cap.sm) +
         "; each plan size class self-checked against the own kernel at first use; " +
         (cudnn_attention::deterministic_requested() ? "deterministic" : "non-deterministic") +
         " backward), the own kernel where cuDNN cannot run one (f32, unsupported head dims: " +
         "said when it happens)";
}

} // namespace vlm::ops_detail
