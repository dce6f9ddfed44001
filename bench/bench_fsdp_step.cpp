// One data-parallel (and tensor-parallel) training step of a random-init Qwen3 under mpirun,
// split into compute and exposed communication (issues 13, 35):
//
//   mpirun -np N bench/bench_fsdp_step [options]   (--help lists them with their defaults: the
//       model's sizes, S = --seq tokens per rank, K = --steps timed steps after --warmup ones,
//       --dtype f32|bf16, --device cpu|cuda, --layout fsdp|ddp|hsdp, --reshard 0|1, --prefetch 0|1,
//       --tp T: a mesh of N / T data-parallel x T tensor-parallel ranks, tp innermost, --layout
//       applying to the data-parallel part; --sp 1: sequence parallelism in the TP group)
//   mpirun -np N bench/bench_fsdp_step --config CONFIG.toml [--set section.key=value ...]
//       the step of a training config instead, through the trainer's code (load_train_config,
//       describe_model, parallelize): its model with random weights, param_dtype, ac_mode,
//       seq_len, step settings and parallel layout (what `vlmtrain train --config` would run on
//       these ranks), on one packed row of random ids per data-parallel rank
//
// Three timings (bench/timing.h), each the median over K steps of the slowest rank, on the
// device's streams (CUDA events; the first two interleaved step by step, so that drift in the
// machine's speed affects both alike):
//   step     the real step: forward, backward, gradient reduction, clipping, AdamW, over the
//            world as --layout says (hsdp: 2 replicas);
//   compute  the same step with every collective replaced by a local copy into the same buffers
//            (parallel/comm/local_group.h, of the same size and rank: the same packing, copies and
//            kernels, no communication; its numbers are not a real job's and are thrown away);
//   comm     the step's collectives alone: recorded from a real step (kind, group, size, in
//            order) and replayed back to back on the same groups;
// exposed communication = step - compute (what the step waits for), overlap = 1 - exposed / comm
// (the share of the communication hidden behind compute; 0 when every collective blocks the
// host, as MPI's do on CPU: nonblocking MPI collectives progress only inside MPI calls). Rank 0
// prints a table and the common records (bench/record.h: step_ms, compute_ms, exposed_comm_ms,
// ...). Each data-parallel rank trains on its own packed row of S tokens (4 documents, random ids
// seeded by its data-parallel rank; tensor-parallel peers share it); the step is
// bench_step_setup.h's at lr 1e-4.
//
// With --tp T > 1 the step's collectives are also split by group (the tensor-parallel group and
// its sub-groups vs the data-parallel ones), and the TP bytes one rank moves per step are checked
// against the count derived from the model (analytic_tp_traffic): the benchmark fails (exit 1)
// when they differ by more than 5%, so a collective added to or lost from the TP path shows here.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_step_setup.h"
#include "bench/record.h"
#include "model/model_spec.h"
#include "parallel/ac/activation_checkpointing.h"
#include "parallel/comm/local_group.h"
#include "parallel/comm/mesh.h"
#include "parallel/comm/mpi_env.h"
#include "parallel/fsdp/fsdp.h"
#include "parallel/parallelize.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/core/device.h"
#include "src/core/stream.h"
#include "src/train/config.h"
#include "src/train/train_step.h"

using namespace vlm;
using parallel::ProcessGroup;
using parallel::ReduceOp;
using parallel::Work;

namespace {

struct Options {
  bench::ModelSize size{256, 4, 4, 2, 64, 768, 8192};
  int64_t seq = 512, reshard = 1, prefetch = 1, tp = 1, sp = 0;
  bench::Timing timing{2, 6};
  std::string dtype = "f32", device = "cpu", layout = "fsdp";
  bench::ConfigOption config;       // a training config: its model, step and layout instead
  std::vector<int64_t> special_ids; // the config model's *_token_id: never drawn for the batch
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  bench::add_model_size_options(app, o.size);
  app.add_option("--seq", o.seq, "tokens per rank (4 documents)")->check(cli::at_least(8));
  app.add_option("--dtype", o.dtype, "parameter and compute dtype")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--device", o.device, "cpu, or cuda (cuda:local_rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--layout", o.layout,
                 "fsdp: shard over all ranks; ddp: replicate; hsdp: 2 replicas")
      ->check(CLI::IsMember({"fsdp", "ddp", "hsdp"}));
  app.add_option("--reshard", o.reshard, "1: free the gathered parameters after forward")
      ->check(CLI::IsMember({0, 1}));
  app.add_option("--prefetch", o.prefetch, "1: gather the next block's parameters ahead")
      ->check(CLI::IsMember({0, 1}));
  app.add_option("--tp", o.tp, "tensor-parallel ranks (innermost; must divide the ranks)")
      ->check(cli::at_least(1));
  app.add_option("--sp", o.sp, "1: sequence parallelism (with --tp > 1)")
      ->check(CLI::IsMember({0, 1}));
  std::vector<std::string> replaced = bench::kModelSizeFlags;
  replaced.insert(replaced.end(), {"--seq", "--dtype", "--layout", "--tp", "--sp"});
  bench::add_config_options(app, o.config, "its param_dtype, ac_mode, seq_len and parallel layout",
                            replaced);
  bench::add_timing_options(app, o.timing, "--steps", "steps");
}

// One collective as a step issued it.
struct Recorded {
  enum Kind { all_gather, reduce_scatter, all_reduce } kind;
  ProcessGroup* group;
  int64_t numel; // of the larger tensor
  DType dtype;
  bool tp; // over the tensor-parallel group or one of its sub-groups
  int64_t bytes() const { return numel * int64_t(dtype_size(dtype)); }
};

// What the recording groups of a real run saw: the collectives in order, and the sub-groups split
// off them (TensorParallel's replica groups when tp exceeds the KV heads), owned here so that the
// replay can still use them after the run is gone.
struct Recording {
  std::vector<Recorded> calls;
  std::vector<std::unique_ptr<ProcessGroup>> subgroups;
};

// Forwards every collective to `inner` and records it (the comm replay). `tp`: the tensor-parallel
// group (and, through split(), its sub-groups).
class RecordingGroup final : public ProcessGroup {
public:
  RecordingGroup(ProcessGroup& inner, Recording& log, bool tp)
      : inner_(inner), log_(log), tp_(tp) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    log_.calls.push_back({Recorded::all_reduce, &inner_, t.numel(), t.dtype(), tp_});
    return inner_.all_reduce_async(t, op);
  }
  std::unique_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    log_.calls.push_back({Recorded::all_gather, &inner_, out.numel(), out.dtype(), tp_});
    return inner_.all_gather_async(out, in);
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                             ReduceOp op) override {
    log_.calls.push_back({Recorded::reduce_scatter, &inner_, in.numel(), in.dtype(), tp_});
    return inner_.reduce_scatter_async(out, in, op);
  }
  void all_reduce(const Tensor& t, ReduceOp op) override { all_reduce_async(t, op)->wait(); }
  void all_gather(const Tensor& out, const Tensor& in) override {
    all_gather_async(out, in)->wait();
  }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    reduce_scatter_async(out, in, op)->wait();
  }
  void broadcast(const Tensor& t, int root) override { inner_.broadcast(t, root); }
  void barrier() override { inner_.barrier(); }
  // The real sub-group (collective over inner's ranks), kept by the recording, recorded too.
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) const override {
    log_.subgroups.push_back(inner_.split(color, key, name));
    return std::make_unique<RecordingGroup>(*log_.subgroups.back(), log_, tp_);
  }

private:
  ProcessGroup& inner_;
  Recording& log_;
  bool tp_;
};

// The compute-only run's stand-in for a real group: LocalProcessGroup's collectives (the same
// buffers and copies, no communication). split() splits the real group (at set-up, untimed: every
// rank of it builds its compute-only run at the same point) and stands in for that sub-group, of
// its size and rank, which a LocalProcessGroup, with no peers to agree with, cannot know.
class StandInGroup final : public ProcessGroup {
public:
  explicit StandInGroup(const ProcessGroup& real) : real_(real), local_(real.rank(), real.size()) {}
  explicit StandInGroup(std::unique_ptr<ProcessGroup> real)
      : owned_(std::move(real)), real_(*owned_), local_(real_.rank(), real_.size()) {}
  int rank() const override { return local_.rank(); }
  int size() const override { return local_.size(); }
  std::string name() const override { return local_.name(); }
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    return local_.all_reduce_async(t, op);
  }
  std::unique_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    return local_.all_gather_async(out, in);
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                             ReduceOp op) override {
    return local_.reduce_scatter_async(out, in, op);
  }
  void all_reduce(const Tensor& t, ReduceOp op) override { local_.all_reduce(t, op); }
  void all_gather(const Tensor& out, const Tensor& in) override { local_.all_gather(out, in); }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    local_.reduce_scatter(out, in, op);
  }
  void broadcast(const Tensor& t, int root) override { local_.broadcast(t, root); }
  void barrier() override { local_.barrier(); }
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) const override {
    return std::make_unique<StandInGroup>(real_.split(color, key, name));
  }

private:
  std::unique_ptr<ProcessGroup> owned_; // the real sub-group this one stands in for, if split
  const ProcessGroup& real_;
  parallel::LocalProcessGroup local_;
};

// The seq-token row of a data-parallel rank: 4 documents of random ids (never one of
// o.special_ids: an image placeholder would need an image).
model::Batch make_batch(const Options& o, int dp_rank) {
  Rng rng(uint64_t(dp_rank) + 1);
  return bench::packed_batch(
      o.seq, 4, bench::avoiding(o.special_ids, [&] { return rng.randint(0, o.size.vocab); }));
}

// Every timing of the benchmark: each run on the device's streams (the communication stream
// included), from a common start to the slowest rank's end.
bench::Timer world_timer(const parallel::DeviceMesh& mesh, Device device) {
  return bench::Timer(device, &mesh.world(), /*whole_device=*/true);
}

// A fresh model sharded over the given groups, with its stepper.
struct Run {
  bench::ParallelModel model;
  std::unique_ptr<train::TrainStepper> stepper;
};

// What every Run is made of.
struct RunSpec {
  nlohmann::json model_config;
  DType dtype;
  train::TrainConfig config;
  parallel::FsdpOptions fsdp;
  Device device;
  bool sequence_parallel = false;
  parallel::AcMode ac = parallel::AcMode::off;
  std::string case_prefix = {}; // the records' case: a --config names its file and model type

  // `tp`: null without tensor parallelism.
  Run make(ProcessGroup& shard, ProcessGroup* replicate, ProcessGroup& dp, ProcessGroup* tp) const {
    Run r;
    parallel::ParallelizeOptions options{ac, fsdp};
    options.sequence_parallel = tp && sequence_parallel;
    r.model = bench::random_parallel_model(model_config, dtype, "bench_fsdp_step",
                                           {&shard, replicate, &dp, tp}, options, device);
    r.stepper = std::make_unique<train::TrainStepper>(config, r.model.model, r.model.parallelized);
    return r;
  }
};

// The median seconds of the real and the compute-only steps, and the collectives of a real step
// (with the recording that owns the sub-groups some of them ran on).
struct StepAndCompute {
  double step_s = 0, compute_s = 0;
  std::vector<Recorded> one_step;
  Recording recording;
};

// 1. the real step (its collectives recorded) and 2. compute alone (stand-in groups of the same
// shape; loss and counts still go over dp), their steps interleaved so that drift in the machine's
// speed affects both alike.
StepAndCompute time_step_and_compute(const Options& o, const parallel::DeviceMesh& mesh,
                                     const RunSpec& spec, const std::vector<model::Batch>& batch) {
  StepAndCompute t; // first: the runs' recording groups refer to its recording
  Recording& log = t.recording;
  RecordingGroup rec_shard(mesh.dp_shard(), log, false), rec_rep(mesh.dp_replicate(), log, false);
  RecordingGroup rec_tp(mesh.tp(), log, true);
  parallel::LocalProcessGroup local_shard(mesh.dp_shard().rank(), mesh.dp_shard().size());
  parallel::LocalProcessGroup local_rep(mesh.dp_replicate().rank(), mesh.dp_replicate().size());
  StandInGroup local_tp(mesh.tp());
  const bool tp = mesh.shape().tp > 1;
  Run real = spec.make(rec_shard, &rec_rep, mesh.dp(), tp ? &rec_tp : nullptr);
  Run alone = spec.make(local_shard, &local_rep, mesh.dp(), tp ? &local_tp : nullptr);
  const bench::Timer timer = world_timer(mesh, spec.device);
  int64_t step_real = 0, step_alone = 0;
  const auto real_step = [&] {
    log.calls.clear();
    real.stepper->step(step_real++, batch);
    t.one_step = log.calls;
  };
  const auto alone_step = [&] { alone.stepper->step(step_alone++, batch); };
  std::tie(t.step_s, t.compute_s) = timer.interleaved(o.timing, real_step, alone_step);
  return t;
}

// 3. the recorded collectives alone, back to back: the median seconds.
double time_comm(const Options& o, const bench::Timer& timer, Device device,
                 const std::vector<Recorded>& one_step) {
  std::vector<std::pair<Tensor, Tensor>> buffers;
  for (const Recorded& r : one_step) {
    const int64_t k = r.group->size();
    const int64_t small = r.kind == Recorded::all_reduce ? r.numel : r.numel / k;
    buffers.push_back(
        {Tensor::zeros({r.numel}, r.dtype, device), Tensor::zeros({small}, r.dtype, device)});
  }
  return timer.median_seconds(o.timing, [&] {
    for (size_t i = 0; i < one_step.size(); i++) {
      const Recorded& r = one_step[i];
      auto& [big, small] = buffers[i];
      if (r.kind == Recorded::all_gather)
        r.group->all_gather(big, small);
      else if (r.kind == Recorded::reduce_scatter)
        r.group->reduce_scatter(small, big);
      else
        r.group->all_reduce(big);
    }
  });
}

// The collectives one rank runs per step over the tensor-parallel group (and its sub-groups),
// counted from the model: Qwen3 with L layers, T = --seq tokens per rank, H hidden, D head dim,
// Hkv KV heads, activations of s bytes (the parameter dtype), one micro-batch, no activation
// checkpointing (nothing recomputed), FSDP over dp_shard = S ranks (the bench always shards,
// S = 1 included: gradients live in FSDP's f32 flat buffers). Without sequence parallelism:
//   forward   2L all-reduces of [T, H] (reduce_from_tp after o_proj and down_proj) and 1 for the
//             vocabulary-parallel embedding's partial lookups:   (2L + 1) T H s
//   backward  2L all-reduces of [T, H] (copy_to_tp at the attention input, q/k/v sharing one
//             entry, and at the MLP input, gate/up sharing one):    2L T H s
//   loss      vocab_parallel_cross_entropy in f32 (its accumulation dtype for f32 and bf16): the
//             row max [T] (4T), [rescaled sum-exp; target logit] [2, T] (8T), and in backward dx
//             [T, H] summed over the ranks' vocabulary parts (4 T H)
//   after     reduce_grads: q_norm and k_norm's partial gradients, each rank's FSDP shard of
//   backward  ceil(D / S) rows in f32: 2L x 4 ceil(D / S); and with more ranks than KV heads,
//             each rank holds one KV head, shared by tp / Hkv ranks, whose gradient shard (FSDP
//             splits dim 0) is summed over them: k_proj and v_proj [ceil(D / S), H] f32,
//             2L x 4 ceil(D / S) H (more ranks than query heads is refused: o_proj's columns)
//   norm      the squared gradient norm summed over tp: one f64 scalar, 8
// The TP bytes per rank and step are the sum; the count of collectives is 6L + 5, plus 2L with
// replicated KV heads. With sequence parallelism (tensor sizes: an all-gather counts its output,
// a reduce-scatter its input, both [T', H] with T' = T rounded up to a multiple of tp), each
// all-reduce of a layer becomes an all-gather and a reduce-scatter, the same bytes on the wire
// but twice the tensor bytes counted here:
//   forward   the embedding's all-reduce (T H s); per layer an all-gather at the attention and
//             the MLP input and a reduce-scatter after o_proj and down_proj (4L T' H s); the
//             layers' output gathered for the final norm (T' H s)
//   backward  the same four per layer, reversed (4L T' H s), and the layers' input gradient
//             gathered (T' H s)
//   loss      as above
//   after     also input_layernorm and post_attention_layernorm: 2L x 4 ceil(H / S)
//   backward
// 12L + 7 collectives, plus 2L with replicated KV heads.
struct TpTraffic {
  int64_t collectives = 0, bytes = 0;
};

TpTraffic analytic_tp_traffic(const Options& o, DType dtype, const parallel::MeshShape& shape) {
  const int64_t L = o.size.layers, T = o.seq, H = o.size.hidden, D = o.size.head_dim;
  const int64_t s = int64_t(dtype_size(dtype)), f32 = 4, f64 = 8;
  const int64_t d_shard = (D + shape.dp_shard - 1) / shape.dp_shard;
  TpTraffic a;
  if (o.sp) {
    const int64_t T_padded = (T + shape.tp - 1) / shape.tp * shape.tp;
    const int64_t h_shard = (H + shape.dp_shard - 1) / shape.dp_shard;
    a.collectives = (4 * L + 2) + (4 * L + 1) + 3 + 4 * L + 1;
    a.bytes = T * H * s + (8 * L + 2) * T_padded * H * s;
    a.bytes += 2 * L * f32 * h_shard;
  } else {
    a.collectives = (2 * L + 1) + 2 * L + 3 + 2 * L + 1;
    a.bytes = (2 * L + 1) * T * H * s + 2 * L * T * H * s;
  }
  a.bytes += f32 * T + f32 * 2 * T + f32 * T * H;
  a.bytes += 2 * L * f32 * d_shard + f64;
  if (shape.tp > o.size.kv_heads) {
    a.collectives += 2 * L;
    a.bytes += 2 * L * f32 * d_shard * H;
  }
  return a;
}

// One side's share of the step's collectives.
struct Traffic {
  size_t collectives = 0;
  int64_t bytes = 0;
};

Traffic traffic(const std::vector<Recorded>& one_step, bool tp) {
  Traffic t;
  for (const Recorded& r : one_step)
    if (r.tp == tp) t.collectives++, t.bytes += r.bytes();
  return t;
}

// Recorded TP bytes over the analytic count.
double tp_bytes_ratio(const std::vector<Recorded>& one_step, const TpTraffic& analytic) {
  return double(traffic(one_step, true).bytes) / double(analytic.bytes);
}

// Rank 0's table and records.
void report(const Options& o, const RunSpec& spec, const parallel::DeviceMesh& mesh, Device device,
            double step, double compute, double comm, const std::vector<Recorded>& one_step,
            const TpTraffic* analytic) {
  // Below 0 (compute measured slower than the whole step) is the noise of the measurement.
  const double exposed = std::max(0.0, step - compute);
  const double overlap = comm > 0 ? std::clamp(1.0 - exposed / comm, 0.0, 1.0) : 0.0;
  int64_t bytes = 0;
  for (const Recorded& r : one_step) bytes += r.bytes();
  const int n = mesh.world().size();
  const Traffic tp = traffic(one_step, true), dp = traffic(one_step, false);
  const bool tensor_parallel = mesh.shape().tp > 1;
  // What was measured: the built-in Qwen3's sizes, or the config's file and model type.
  const std::string model_name = spec.case_prefix.empty()
                                     ? "qwen3 hidden " + std::to_string(o.size.hidden) + " x " +
                                           std::to_string(o.size.layers) + " layers, vocab " +
                                           std::to_string(o.size.vocab)
                                     : spec.case_prefix + ", ac " + parallel::ac_mode_name(spec.ac);
  std::printf("fsdp step, %d ranks (%s), %s, %lld tokens per rank%s, %s on %s, %d threads\n", n,
              mesh.shape().str().c_str(), model_name.c_str(), (long long)o.seq,
              o.sp ? " (sequence parallel)" : "", o.dtype.c_str(), device.str().c_str(),
              omp_get_max_threads());
  std::printf("  step %.1f ms = compute %.1f ms + exposed communication %.1f ms%s; the step's "
              "%zu collectives (%.1f MiB) alone take %.1f ms: overlap %.0f%%\n",
              step * 1e3, compute * 1e3, exposed * 1e3,
              step < compute ? " (compute measured above the step: noise)" : "", one_step.size(),
              double(bytes) / double(1 << 20), comm * 1e3, overlap * 100);
  if (tensor_parallel && analytic)
    std::printf(
        "  per rank: tensor parallel %zu collectives, %lld bytes (analytic %lld collectives, "
        "%lld bytes: recorded / analytic %.4f); data parallel %zu collectives, %lld "
        "bytes\n",
        tp.collectives, (long long)tp.bytes, (long long)analytic->collectives,
        (long long)analytic->bytes, tp_bytes_ratio(one_step, *analytic), dp.collectives,
        (long long)dp.bytes);
  else if (tensor_parallel)
    std::printf("  per rank: tensor parallel %zu collectives, %lld bytes; data parallel %zu "
                "collectives, %lld bytes\n",
                tp.collectives, (long long)tp.bytes, dp.collectives, (long long)dp.bytes);
  // The common records (bench/record.h); the case names the model and what the mesh does not.
  const std::string case_name = model_name + ", " + std::to_string(o.seq) + " tokens per rank, " +
                                o.dtype + (o.sp ? ", sequence parallel" : "") + ", --layout " +
                                o.layout;
  const std::string mesh_name = std::to_string(n) + " ranks: " + mesh.shape().str();
  auto emit = [&](const char* metric, double value, std::optional<double> reference = {}) {
    bench::emit("bench_fsdp_step", case_name, mesh_name, device.str(), metric, value, reference);
  };
  emit("step_ms", step * 1e3);
  emit("compute_ms", compute * 1e3);
  emit("exposed_comm_ms", exposed * 1e3);
  emit("comm_ms", comm * 1e3);
  emit("overlap", overlap);
  emit("comm_bytes", double(bytes));
  emit("collectives", double(one_step.size()));
  emit("threads", double(omp_get_max_threads()));
  if (tensor_parallel) { // against the analytic count where there is one
    emit("tp_bytes", double(tp.bytes),
         analytic ? std::optional<double>(double(analytic->bytes)) : std::nullopt);
    emit("tp_collectives", double(tp.collectives),
         analytic ? std::optional<double>(double(analytic->collectives)) : std::nullopt);
    emit("dp_bytes", double(dp.bytes));
  }
}

// What a run is made of, and the mesh's shape. From the options: the built-in Qwen3 of --hidden
// ... --vocab, --dtype, --tp, --sp, --layout.
struct Setup {
  RunSpec spec;
  parallel::MeshShape shape;
};

Setup setup_from_options(Options& o, const parallel::MpiWorld& w, Device device) {
  const int n = w.size;
  VLM_CHECK(n % o.tp == 0, "bench_fsdp_step: --tp ", o.tp, " does not divide the ", n, " ranks");
  const int64_t dp = n / o.tp;
  const int64_t replicas = o.layout == "ddp" ? dp : o.layout == "hsdp" ? 2 : 1;
  VLM_CHECK(dp % replicas == 0, "bench_fsdp_step: --layout hsdp needs an even number of ",
            o.tp > 1 ? "data-parallel ranks (ranks / --tp = " + std::to_string(dp) + ")" : "ranks");
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  Setup s{{bench::sized_qwen3_config(o.size, o.seq), dtype, bench::step_config(dtype, 1000, 1e-4),
           parallel::FsdpOptions{}, device},
          {replicas, dp / replicas, o.tp}};
  VLM_CHECK(o.sp == 0 || o.tp > 1, "bench_fsdp_step: --sp 1 needs --tp > 1");
  s.spec.sequence_parallel = o.sp != 0;
  return s;
}

// The step of a training config (bench_step_setup.h's load_config_step: the trainer's own code),
// its param_dtype, ac_mode, seq_len and step settings, and its layout (resolve_mesh_shape). The
// options it replaces are rewritten (--seq, --vocab, --tp, --sp, --layout, --dtype) so that the
// batch and the records follow it.
Setup setup_from_config(Options& o, const parallel::MpiWorld& w, Device device) {
  bench::ConfigStep cs = bench::load_config_step(o.config, o.timing.warmup + o.timing.iters);
  train::TrainConfig& c = cs.config;
  const bool sharded = c.parallel.data_parallel == train::DataParallel::fsdp;
  const parallel::MeshShape shape = parallel::resolve_mesh_shape(
      w.size, c.parallel.dp_replicate, c.parallel.dp_shard, c.parallel.tp_size, sharded);
  o.seq = c.data.seq_len;
  o.size.vocab = cs.vocab;
  o.special_ids = cs.special_ids;
  o.tp = shape.tp;
  o.sp = c.parallel.sequence_parallel ? 1 : 0;
  o.layout = !sharded ? "ddp" : shape.dp_replicate > 1 ? "hsdp" : "fsdp";
  o.dtype = dtype_name(c.training.param_dtype);
  c.training.micro_batch_rows = 1;
  Setup s{{cs.hf_config, c.training.param_dtype, c, parallel::FsdpOptions{}, device}, shape};
  s.spec.ac = c.training.ac_mode;
  s.spec.sequence_parallel = c.parallel.sequence_parallel;
  s.spec.case_prefix = cs.name;
  return s;
}

int run(Options o) {
  const parallel::MpiWorld& w = parallel::require_mpi();
  const Device device =
      o.device == "cuda"
          ? parse_device("cuda:" + std::to_string(w.local_rank % std::max(1, cuda_device_count())))
          : Device::cpu();
  check_device_available(device, "--device");
  Setup setup =
      o.config.path.empty() ? setup_from_options(o, w, device) : setup_from_config(o, w, device);
  RunSpec& spec = setup.spec;
  spec.fsdp.reshard_after_forward = o.reshard != 0;
  spec.fsdp.prefetch = o.prefetch != 0;
  parallel::DeviceMesh mesh(parallel::world_group(), setup.shape);
  if (device.is_cuda()) mesh.connect(device); // as the trainer: no communicator made in a step
  const std::vector<model::Batch> batch{model::to_device(make_batch(o, mesh.dp_rank()), device)};

  const StepAndCompute t = time_step_and_compute(o, mesh, spec, batch);
  const double step = t.step_s, compute = t.compute_s;
  const double comm = time_comm(o, world_timer(mesh, device), device, t.one_step);
  // The analytic TP count is derived for the built-in Qwen3 without checkpointing only.
  const bool check_tp = o.config.path.empty() && mesh.shape().tp > 1;
  const TpTraffic analytic = analytic_tp_traffic(o, spec.dtype, mesh.shape());
  if (w.rank == 0)
    report(o, spec, mesh, device, step, compute, comm, t.one_step, check_tp ? &analytic : nullptr);
  // Every rank records the same collectives, so every rank reaches the same verdict.
  if (check_tp && std::abs(tp_bytes_ratio(t.one_step, analytic) - 1.0) > 0.05) {
    if (w.rank == 0)
      std::fprintf(stderr,
                   "error: bench_fsdp_step: the tensor-parallel collectives moved %lld bytes per "
                   "rank, the analytic count is %lld (more than 5%% apart)\n",
                   (long long)traffic(t.one_step, true).bytes, (long long)analytic.bytes);
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"One data-parallel (and tensor-parallel) training step under mpirun, split into "
               "compute and exposed communication.",
               "bench_fsdp_step"};
  Options o;
  add_options(app, o);
  return bench::run_main(
      app, argc, argv, [&] { return run(o); }, parallel::abort_job_if_parallel);
}
