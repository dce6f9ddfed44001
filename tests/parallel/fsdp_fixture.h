// What the data-parallel tests share: tiny models of every family (the golden snapshots), their
// micro-batches — packed text rows, and for the VLMs packed rows with two images, text-only rows
// and rows whose labels are all masked — and two ways to train them for a few steps: one process
// on the whole global batch (the reference), or the same batch spread over a DeviceMesh with
// FSDP / HSDP / DDP. Every rank can compute the reference by itself (no communication).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/batch_file.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "parallel/ac/activation_checkpointing.h"
#include "parallel/comm/mesh.h"
#include "parallel/fsdp/fsdp.h"
#include "parallel/parallelize.h"
#include "src/base/rng.h"
#include "src/core/ops/elementwise.h"
#include "src/train/train_state.h"
#include "src/train/train_step.h"

namespace vlm::testing {

struct Family {
  const char* name;
  const char* snapshot; // folder under tests/data
  bool vision;
  // fp32 parameters after 20 AdamW steps vs one process, L2 of the difference per tensor
  // (tests/parallel/test_fsdp_equivalence_mpi.cpp says why not 1e-6). The 8-layer hybrid Qwen3.5
  // passes rounding on further: measured up to 1.0e-5 (its 16-wide vision tower's norm biases)
  // where the others stay below 4.4e-6, and on an AMD EPYC (other BLAS kernels) 3.4e-5 with a
  // loss 1.09e-6 off at step 19 of 20 under HSDP 2 x 2 + full AC (the same before and after issue
  // 35's memory work); its one-step gradients agree to 1.2e-7 and its f64 runs to rounding like
  // the others'.
  double param_l2_tolerance = 1e-5;
  double loss_tolerance = 1e-6; // relative, every step
};

// Every family of the registry, tied and untied: new families add their snapshots here.
inline const std::vector<Family>& all_families() {
  static const std::vector<Family> f = {
      {"qwen3 (untied)", "qwen3_tiny_untied", false},
      {"qwen3 (tied)", "qwen3_tiny_tied", false},
      {"qwen3_vl (untied)", "qwen3_vl_tiny_untied", true},
      {"qwen3_vl (tied)", "qwen3_vl_tiny_tied", true},
      {"qwen3_5 (hybrid)", "qwen3_5_tiny_hybrid", true, 6e-5, 3e-6},
      {"qwen3_5 (tied)", "qwen3_5_tiny_tied", true}};
  return f;
}

inline std::string test_data(const std::string& rel) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/" + rel;
}

// Token ids of the random text: below the tiny configs' special ids (500-503).
constexpr int64_t kTextVocab = 400;

// Documents of random tokens packed into one row of about 64 tokens; targets random, -100 on
// each document's last token and on about one in five others. MRoPE rows carry [3, T] positions
// (text: the same position on every plane).
inline model::Batch text_batch(uint64_t seed, bool mrope) {
  Rng rng(seed, 7);
  std::vector<int64_t> ids, targets, pos;
  std::vector<int32_t> cu{0};
  const int docs = int(rng.randint(1, 4));
  for (int d = 0; d < docs; d++) {
    const int64_t len = rng.randint(3, 30);
    for (int64_t t = 0; t < len; t++) {
      ids.push_back(rng.randint(0, kTextVocab));
      targets.push_back(t + 1 == len || rng.uniform() < 0.2 ? -100 : rng.randint(0, kTextVocab));
      pos.push_back(t);
    }
    cu.push_back(int32_t(ids.size()));
  }
  const int64_t T = int64_t(ids.size());
  model::Batch b;
  b.input_ids = Tensor::from_vector(ids, {T});
  b.targets = Tensor::from_vector(targets, {T});
  if (mrope) {
    std::vector<int64_t> planes;
    for (int k = 0; k < 3; k++) planes.insert(planes.end(), pos.begin(), pos.end());
    b.position_ids = Tensor::from_vector(planes, {3, T});
  } else {
    b.position_ids = Tensor::from_vector(pos, {T});
  }
  b.cu_seqlens = Tensor::from_vector(cu, {int64_t(cu.size())});
  return b;
}

// The Qwen3-VL golden row (a text document, a document with two images of grids (1, 4, 6) and
// (1, 10, 8), a short text document) with fresh random text tokens, targets and pixels: the image
// placeholders, grids and MRoPE positions stay as the packer made them.
inline model::Batch image_batch(uint64_t seed) {
  static const model::Batch golden =
      model::read_batch_file(test_data("qwen3_vl_tiny_batches/untied_packed.safetensors"), true);
  Rng rng(seed, 11);
  std::vector<double> ids = golden.input_ids.to_doubles(), tg = golden.targets.to_doubles();
  std::vector<int64_t> new_ids, new_targets;
  for (size_t t = 0; t < ids.size(); t++) {
    const bool special = ids[t] >= 500 && ids[t] <= 503;
    new_ids.push_back(special ? int64_t(ids[t]) : rng.randint(0, kTextVocab));
    new_targets.push_back(tg[t] == -100 ? -100 : rng.randint(0, kTextVocab));
  }
  model::Batch b = golden;
  const int64_t T = int64_t(new_ids.size());
  b.input_ids = Tensor::from_vector(new_ids, {T});
  b.targets = Tensor::from_vector(new_targets, {T});
  b.pixel_values = Tensor::randn(golden.pixel_values.shape(), rng);
  b.num_targets = -1;
  return b;
}

// Every target -100: the micro-batch adds nothing to the loss, but its rank must still take part.
inline model::Batch masked(model::Batch b) {
  b.targets = Tensor::full(b.targets.shape(), -100, DType::i64);
  b.num_targets = -1;
  return b;
}

// Micro-batch m of data-parallel rank r (of `ranks`) at step s: Qwen3-VL rows carry images,
// except the first micro-batch of rank 1 (rank 0 when alone) at every even step, which is
// text-only; at step 3 the last micro-batch of rank 0 is fully masked.
inline model::Batch micro_batch(const Family& f, int s, int r, int m, int accumulation, int ranks) {
  const uint64_t seed = uint64_t(s) * 1000 + uint64_t(r) * 10 + uint64_t(m);
  const bool text_only = !f.vision || (s % 2 == 0 && m == 0 && r == (ranks > 1 ? 1 : 0));
  model::Batch b = text_only ? text_batch(seed, f.vision) : image_batch(seed);
  if (s == 3 && r == 0 && m == accumulation - 1) b = masked(b);
  return b;
}

inline train::TrainConfig equivalence_config() {
  train::TrainConfig c;
  auto& t = c.training;
  t.total_steps = 20;
  t.warmup_steps = 3;
  t.scheduler_type = optim::ScheduleType::cosine;
  t.lr_llm = t.lr_mlp = t.lr_vit = 1e-3;
  t.weight_decay = 0.1;
  t.max_grad_norm = 1.0;
  t.param_dtype = DType::f32;
  c.model.train_vit = true;
  return c;
}

struct RunResult {
  std::vector<double> losses; // per step
  std::map<std::string, std::vector<double>> params;
  int64_t state_bytes = 0; // parameters + gradients + optimizer state on this rank
  double moved = 0;        // ||trained - initial|| / ||initial|| over all parameters
};

// The family's tiny model loaded and frozen as the trainer does, nothing parallel applied yet.
inline std::shared_ptr<model::CausalLM> loaded_family_model(const Family& f,
                                                            const train::TrainConfig& c) {
  auto m = model::load_pretrained(test_data(f.snapshot), c.training.param_dtype);
  train::apply_freezing(c, *m);
  return m;
}

// A family model made parallel over `groups` (all null: one process) as the trainer does it
// (parallel/parallelize.h), with c.training.ac_mode and FSDP `options`, on `device`.
struct ParallelFamilyModel {
  std::shared_ptr<model::CausalLM> model;
  parallel::Parallelized parallelized; // after the model: undone first
  const parallel::Parallelized& step_parallel() const { return parallelized; }
};
inline ParallelFamilyModel parallel_family_model(const Family& f, const train::TrainConfig& c,
                                                 const parallel::ParallelGroups& groups,
                                                 const parallel::FsdpOptions& options = {},
                                                 Device device = Device::cpu()) {
  ParallelFamilyModel out{loaded_family_model(f, c), {}};
  out.parallelized = parallel::parallelize(*out.model, out.model->blocks(), groups,
                                           {c.training.ac_mode, options}, device);
  return out;
}

inline int64_t optimizer_bytes(optim::AdamW& opt) {
  int64_t bytes = 0;
  for (const auto& name : opt.param_names()) {
    const optim::AdamWState& st = opt.state(name);
    bytes += int64_t(st.exp_avg.nbytes() + st.exp_avg_sq.nbytes());
    if (st.master.defined()) bytes += int64_t(st.master.nbytes());
  }
  return bytes;
}

inline int64_t param_and_grad_bytes(const nn::Module& m) {
  int64_t bytes = 0;
  for (const auto& p : m.named_parameters()) {
    bytes += int64_t(p.tensor.nbytes());
    if (p.tensor.requires_grad()) bytes += p.tensor.numel() * int64_t(dtype_size(DType::f32));
  }
  return bytes;
}

// One process on the global batch: every data rank's micro-batches, rank by rank.
inline RunResult run_single(const Family& f, const train::TrainConfig& c, int data_ranks,
                            int accumulation, int steps) {
  const ParallelFamilyModel one = parallel_family_model(f, c, {});
  const std::shared_ptr<model::CausalLM>& m = one.model;
  std::map<std::string, std::vector<double>> initial;
  for (const auto& p : m->named_parameters()) initial[p.name] = p.tensor.to_doubles();
  train::TrainStepper stepper(c, m, one.step_parallel());
  RunResult out;
  for (int s = 0; s < steps; s++) {
    std::vector<model::Batch> batches;
    for (int r = 0; r < data_ranks; r++)
      for (int k = 0; k < accumulation; k++)
        batches.push_back(micro_batch(f, s, r, k, accumulation, data_ranks));
    out.losses.push_back(stepper.step(s, batches).loss);
  }
  double change = 0, norm = 0;
  for (const auto& p : m->named_parameters()) {
    out.params[p.name] = p.tensor.to_doubles();
    const std::vector<double>& a = out.params[p.name];
    const std::vector<double>& b = initial.at(p.name);
    for (size_t i = 0; i < a.size(); i++)
      change += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  }
  out.moved = std::sqrt(change / norm);
  out.state_bytes = param_and_grad_bytes(*m) + optimizer_bytes(stepper.optimizer());
  return out;
}

// The same steps on this rank's share, data-parallel over `mesh`; the parameters are gathered
// whole at the end.
inline RunResult run_parallel(const Family& f, const train::TrainConfig& c,
                              parallel::DeviceMesh& mesh, const parallel::FsdpOptions& options,
                              int accumulation, int steps) {
  // FSDP even with one data-parallel rank (mpirun -np 1 tests the sharded path too).
  const ParallelFamilyModel run =
      parallel_family_model(f, c, parallel::ParallelGroups::of(mesh), options);
  const std::shared_ptr<model::CausalLM>& m = run.model;
  parallel::Fsdp& fsdp = *run.parallelized.fsdp();
  train::TrainStepper stepper(c, m, run.step_parallel());
  RunResult out;
  for (int s = 0; s < steps; s++) {
    std::vector<model::Batch> batches;
    for (int k = 0; k < accumulation; k++)
      batches.push_back(micro_batch(f, s, mesh.dp_rank(), k, accumulation, int(mesh.shape().dp())));
    out.losses.push_back(stepper.step(s, batches).loss);
  }
  const parallel::FsdpMemory mem = fsdp.memory();
  out.state_bytes = mem.param_bytes + mem.grad_bytes + optimizer_bytes(stepper.optimizer());
  fsdp.unshard_all();
  for (const auto& p : m->named_parameters()) out.params[p.name] = p.tensor.to_doubles();
  fsdp.reshard_all();
  return out;
}

// The layouts every family is checked under on `world` ranks.
struct FsdpLayout {
  const char* name;
  parallel::MeshShape shape;
  parallel::FsdpOptions options;
  parallel::AcMode ac = parallel::AcMode::off;
};

inline std::vector<FsdpLayout> fsdp_layouts(int world) {
  std::vector<FsdpLayout> out;
  parallel::FsdpOptions plain;
  out.push_back({"FSDP", {1, world, 1}, plain});
  out.push_back({"DDP", {world, 1, 1}, plain});
  if (world == 4) out.push_back({"HSDP 2x2, full AC", {2, 2, 1}, plain, parallel::AcMode::full});
  parallel::FsdpOptions lazy;
  lazy.reshard_after_forward = false;
  lazy.reduce_every_micro_step = false;
  lazy.prefetch = false;
  out.push_back({"FSDP, no reshard, reduce on the last micro-step, selective AC",
                 {1, world, 1},
                 lazy,
                 parallel::AcMode::selective});
  return out;
}

// One step's forward and backward over this rank's `micro_batches` under `fsdp` (no update):
// the loss sums scaled by `scale`, gradients reduced on the last micro-step.
inline void fsdp_backward(parallel::Fsdp& fsdp, model::CausalLM& m,
                          const std::vector<model::Batch>& micro_batches, double scale) {
  const size_t n = micro_batches.size();
  for (size_t k = 0; k < n; k++) {
    fsdp.begin_micro_step(k == 0, k + 1 == n);
    affine(model::lm_loss(m, micro_batches[k], Reduction::sum), scale).backward();
    fsdp.end_micro_step();
  }
}

// Every parameter of a parallelized model whole, as one process holds it (collective).
inline std::map<std::string, std::vector<double>> whole_params(const nn::Module& model,
                                                               const parallel::Parallelized& p) {
  std::map<std::string, std::vector<double>> out;
  p.unshard_all();
  for (const auto& np : model.named_parameters()) out[np.name] = np.tensor.to_doubles();
  p.reshard_all();
  return out;
}

// The training state of a parallelized model and its stepper at `step` (its layouts: FSDP rows and
// TP parts), for the checkpoint tests.
inline train::TrainState train_state(const ParallelFamilyModel& run, train::TrainStepper& stepper,
                                     int64_t step) {
  train::TrainState st;
  st.step = step;
  st.model = run.model.get();
  st.optimizer = &stepper.optimizer();
  st.schedule = &stepper.schedule();
  st.layouts = run.parallelized.param_layouts();
  return st;
}

// --- comparisons ---------------------------------------------------------------------------------

// max |a - b| / max |b| (max-norm relative error).
inline double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); i++) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// The elements whose gradient is exactly zero in exact arithmetic: the key bias (the middle third
// of a fused qkv bias). Their values after training are AdamW applied to rounding noise.
inline bool noise_only(const std::string& name, size_t i, size_t n) {
  const std::string suffix = "attn.qkv.bias";
  const bool qkv_bias = name.size() >= suffix.size() &&
                        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return qkv_bias && i >= n / 3 && i < 2 * n / 3;
}

// The comparable elements of a parameter (noise_only ones dropped).
inline std::vector<double> comparable(const std::string& name, const std::vector<double>& v) {
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); i++)
    if (!noise_only(name, i, v.size())) out.push_back(v[i]);
  return out;
}

// ||a - b|| / ||b|| (L2).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); i++) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

} // namespace vlm::testing
