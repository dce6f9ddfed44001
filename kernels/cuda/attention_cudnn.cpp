// cuDNN fused attention through the cuDNN frontend graph API (kernels/attention_cudnn.h). A .cpp
// compiled by the host compiler: the frontend is a large header-only library that nvcc need not
// see. Built with the graph code only when CMake found cuDNN and the frontend headers
// (VLM_WITH_CUDNN_FRONTEND); otherwise every entry point says why it cannot run.
//
// Graphs: io bf16, intermediate and compute fp32; Q, K, V, O, dO and
// the gradients as [B, H, S, D] with the strides of packed [T, H, D] rows, each sequence placed by
// an int64 ragged offset and masked by its length (padding mask); Stats token-major [T, Hq]
// fp32; causal as the top-left diagonal band. Plans are built once per PlanKey (per thread and
// device) and kept; the workspace comes from the stream-ordered pool per call.
#include "kernels/attention_cudnn.h"

#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"
#include "kernels/gpu_runtime.h"

#if VLM_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#endif

namespace vlm::kernels::cudnn_attention::cuda {

#if VLM_WITH_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

namespace {

// The variant pack's uids: ours, stable, one per tensor the caller supplies.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqLenQ,
  kSeqLenKV,
  kQOffset,
  kKVOffset,
  kStatsOffset,
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph; // null when it could not be built (see error)
  int64_t workspace = 0;
  std::string error;
};

std::string describe(fe::error_t& e, const char* step) {
  std::ostringstream s;
  s << step << ": " << e.get_code() << ": " << e.get_message();
  return s.str();
}

// Codes that mean the graph we declared is wrong (our bug: fail loudly), as opposed to cuDNN not
// supporting it here (fall back).
bool our_mistake(fe::error_code_t code) {
  return code == fe::error_code_t::ATTRIBUTE_NOT_SET ||
         code == fe::error_code_t::SHAPE_DEDUCTION_FAILED ||
         code == fe::error_code_t::INVALID_TENSOR_NAME || code == fe::error_code_t::INVALID_VALUE;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The tensors both graphs declare the same way.
struct Common {
  TensorPtr q, k, v, seq_q, seq_kv, q_offset, kv_offset, stats_offset;
};

std::vector<int64_t> rows_dims(const PlanKey& key, int64_t heads) {
  return {key.batch, heads, key.max_seq, key.head_dim};
}
// Packed rows: token stride heads·D, head stride D; the batch stride S·heads·D only passes the
// alignment checks: the ragged offset places each sequence.
std::vector<int64_t> rows_strides(const PlanKey& key, int64_t heads) {
  const int64_t row = heads * key.head_dim;
  return {key.max_seq * row, key.head_dim, row, 1};
}

TensorPtr rows(fe::graph::Graph& g, const PlanKey& key, const char* name, int64_t uid,
               int64_t heads, const TensorPtr& offset) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(rows_dims(key, heads))
                      .set_stride(rows_strides(key, heads))
                      .set_data_type(fe::DataType_t::BFLOAT16)
                      .set_ragged_offset(offset));
}
void as_rows(const TensorPtr& t, const PlanKey& key, int64_t uid, int64_t heads,
             const TensorPtr& offset) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim(rows_dims(key, heads))
      .set_stride(rows_strides(key, heads))
      .set_data_type(fe::DataType_t::BFLOAT16)
      .set_ragged_offset(offset);
}
std::vector<int64_t> stats_dims(const PlanKey& key) {
  return {key.batch, key.q_heads, key.max_seq, 1};
}
std::vector<int64_t> stats_strides(const PlanKey& key) {
  return {key.max_seq * key.q_heads, 1, key.q_heads, 1};
}

std::shared_ptr<fe::graph::Graph> new_graph(Common& c, const PlanKey& key) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // Before any node: each node copies the graph's context when it is added. Without a device
  // (validate_graphs) it is the only source of the SM; with one it equals the device's.
  g->set_sm_version(int32_t(key.sm));
  auto offsets = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({key.batch + 1, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT64));
  };
  auto lengths = [&](const char* name, int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({key.batch, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  c.q_offset = offsets("q_offset", kQOffset);
  c.kv_offset = offsets("kv_offset", kKVOffset);
  c.stats_offset = offsets("stats_offset", kStatsOffset);
  c.seq_q = lengths("seq_len_q", kSeqLenQ);
  c.seq_kv = lengths("seq_len_kv", kSeqLenKV);
  c.q = rows(*g, key, "Q", kQ, key.q_heads, c.q_offset);
  c.k = rows(*g, key, "K", kK, key.kv_heads, c.kv_offset);
  c.v = rows(*g, key, "V", kV, key.kv_heads, c.kv_offset);
  return g;
}

template <typename Attributes> void set_mask(Attributes& a, const Common& c, const PlanKey& key) {
  a.set_attn_scale(key.scale).set_padding_mask(true).set_seq_len_q(c.seq_q).set_seq_len_kv(
      c.seq_kv);
  // Packed self-attention: s_q = s_kv per sequence, so top-left and bottom-right coincide.
  if (key.causal)
    a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
}

std::shared_ptr<fe::graph::Graph> forward_graph(const PlanKey& key) {
  Common c;
  auto g = new_graph(c, key);
  fe::graph::SDPA_attributes a;
  a.set_name("sdpa_forward").set_generate_stats(true);
  set_mask(a, c, key);
  auto [o, stats] = g->sdpa(c.q, c.k, c.v, a);
  as_rows(o, key, kO, key.q_heads, c.q_offset);
  stats->set_output(true)
      .set_uid(kStats)
      .set_dim(stats_dims(key))
      .set_stride(stats_strides(key))
      .set_data_type(fe::DataType_t::FLOAT)
      .set_ragged_offset(c.stats_offset);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const PlanKey& key) {
  Common c;
  auto g = new_graph(c, key);
  auto o = rows(*g, key, "O", kO, key.q_heads, c.q_offset);
  auto dout = rows(*g, key, "dO", kDO, key.q_heads, c.q_offset);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("Stats")
                             .set_uid(kStats)
                             .set_dim(stats_dims(key))
                             .set_stride(stats_strides(key))
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_ragged_offset(c.stats_offset));
  fe::graph::SDPA_backward_attributes a;
  a.set_name("sdpa_backward")
      .set_max_total_seq_len_q(key.max_total)
      .set_max_total_seq_len_kv(key.max_total)
      .set_deterministic_algorithm(key.deterministic);
  set_mask(a, c, key);
  auto [dq, dk, dv] = g->sdpa_backward(c.q, c.k, c.v, o, dout, stats, a);
  as_rows(dq, key, kDQ, key.q_heads, c.q_offset);
  as_rows(dk, key, kDK, key.kv_heads, c.kv_offset);
  as_rows(dv, key, kDV, key.kv_heads, c.kv_offset);
  return g;
}

// One handle per thread and device (cuDNN handles are not shared across threads); kept for the
// process, as the plans built with them are.
cudnnHandle_t handle_for(int device) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  VLM_CUDNN_CHECK(cudnnCreate(&h));
  handles.emplace(device, h);
  return h;
}

// Validates and plans `g` (heuristics A, then the fallback list). "" or why not; our own graph
// mistakes throw.
std::string build(fe::graph::Graph& g, cudnnHandle_t handle, int64_t& workspace) {
  auto step = [](fe::error_t e, const char* name) -> std::string {
    if (e.is_good()) return "";
    const std::string what = describe(e, name);
    VLM_CHECK(!our_mistake(e.get_code()),
              "cuDNN attention: the graph we declared is wrong: ", what);
    return what;
  };
  std::string err = step(g.validate(), "validate");
  if (err.empty()) err = step(g.build_operation_graph(handle), "build_operation_graph");
  if (err.empty())
    err = step(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
               "create_execution_plans");
  if (err.empty()) err = step(g.check_support(handle), "check_support");
  if (err.empty()) err = step(g.build_plans(handle), "build_plans");
  if (err.empty()) err = step(g.get_workspace_size(workspace), "get_workspace_size");
  return err;
}

std::atomic<int64_t> g_plans_built{0};

const Plan& plan_for(const PlanKey& key, bool backward, int device) {
  // Per thread (execution plans are not guaranteed thread-safe), per device.
  using Cache = std::unordered_map<PlanKey, Plan, PlanKeyHash>;
  thread_local std::unordered_map<int, Cache> caches[2];
  Cache& cache = caches[backward][device];
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  g_plans_built++;
  Plan p;
  p.graph = backward ? backward_graph(key) : forward_graph(key);
  p.error = build(*p.graph, handle_for(device), p.workspace);
  if (!p.error.empty()) p.graph.reset();
  return cache.emplace(key, std::move(p)).first->second;
}

std::string run(const PlanKey& key, bool backward, std::unordered_map<int64_t, void*>& pack,
                const void* ragged, void* stream) {
  const int device = kernels::cuda::current_device();
  const Plan& p = plan_for(key, backward, device);
  if (!p.graph) return p.error;
  const RaggedParts parts = ragged_parts(key.batch);
  auto* base = static_cast<uint8_t*>(const_cast<void*>(ragged));
  pack[kSeqLenQ] = base + parts.seq_len;
  pack[kSeqLenKV] = base + parts.seq_len;
  pack[kQOffset] = base + parts.q_offset;
  pack[kKVOffset] = base + parts.kv_offset;
  pack[kStatsOffset] = base + parts.stats_offset;
  cudnnHandle_t h = handle_for(device);
  VLM_CUDNN_CHECK(cudnnSetStream(h, static_cast<cudaStream_t>(stream)));
  void* workspace = kernels::cuda::malloc_async(size_t(p.workspace), stream);
  fe::error_t e = p.graph->execute(h, pack, workspace);
  kernels::cuda::count_library_call();
  kernels::cuda::free_async(workspace, stream);
  VLM_CHECK(e.is_good(), "cuDNN attention ", backward ? "backward" : "forward", " (", key.str(),
            "): ", describe(e, "execute"));
  return "";
}

} // namespace

bool frontend_built() { return true; }

std::string frontend_version() {
  return std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

int64_t cudnn_version() { return int64_t(cudnnGetVersion()); }

std::string build_plans(const PlanKey& key, int64_t& workspace) {
  const int device = kernels::cuda::current_device();
  const Plan& fwd = plan_for(key, false, device);
  if (!fwd.graph) return "forward " + fwd.error;
  const Plan& bwd = plan_for(key, true, device);
  if (!bwd.graph) return "backward " + bwd.error;
  workspace = bwd.workspace;
  return "";
}

int64_t plans_built() { return g_plans_built.load(); }

std::string validate_graphs(const PlanKey& key) {
  for (bool backward : {false, true}) {
    auto g = backward ? backward_graph(key) : forward_graph(key);
    fe::error_t e = g->validate();
    if (e.is_bad())
      return std::string(backward ? "backward " : "forward ") + describe(e, "validate");
  }
  return "";
}

std::string sdpa_fwd(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                     const void* ragged, const PlanKey& key, void* stream) {
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<bf16*>(q)},
                                             {kK, const_cast<bf16*>(k)},
                                             {kV, const_cast<bf16*>(v)},
                                             {kO, out},
                                             {kStats, lse}};
  return run(key, false, pack, ragged, stream);
}

std::string sdpa_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                     const bf16* v, const bf16* out, const float* lse, const void* ragged,
                     const PlanKey& key, void* stream) {
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<bf16*>(q)},
                                             {kK, const_cast<bf16*>(k)},
                                             {kV, const_cast<bf16*>(v)},
                                             {kO, const_cast<bf16*>(out)},
                                             {kDO, const_cast<bf16*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dq},
                                             {kDK, dk},
                                             {kDV, dv}};
  return run(key, true, pack, ragged, stream);
}

#else // no cuDNN frontend in this build

namespace {
const char* kNotBuilt =
    "this build has no cuDNN frontend (tools/deps/fetch_cudnn_frontend.sh, then rebuild)";
}

bool frontend_built() { return false; }
std::string frontend_version() { return "not built"; }
int64_t cudnn_version() {
#if VLM_WITH_CUDNN
  return int64_t(cudnnGetVersion());
#else
  return 0;
#endif
}
std::string validate_graphs(const PlanKey&) { return kNotBuilt; }
std::string sdpa_fwd(bf16*, float*, const bf16*, const bf16*, const bf16*, const void*,
                     const PlanKey&, void*) {
  return kNotBuilt;
}
std::string sdpa_bwd(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                     const bf16*, const float*, const void*, const PlanKey&, void*) {
  return kNotBuilt;
}
std::string build_plans(const PlanKey&, int64_t&) { return kNotBuilt; }
int64_t plans_built() { return 0; }

#endif

Capability capability(int device) {
  Capability c;
  int major = 0, minor = 0;
  VLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  VLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  c.sm = major * 10 + minor;
  c.cudnn_version = cudnn_version();
  c.frontend_built = frontend_built();
  return c;
}

} // namespace vlm::kernels::cudnn_attention::cuda
