// One data-parallel training step of a random-init Qwen3 under mpirun, split into compute and
// exposed communication (issue 13):
//
//   mpirun -np N bench/bench_fsdp_step [--hidden H (256)] [--layers L (4)] [--heads (4)]
//       [--kv-heads (2)] [--head-dim (64)] [--ffn (768)] [--vocab (8192)] [--seq S (512)]
//       [--steps K (8)] [--warmup W (2)] [--dtype f32|bf16 (f32)] [--device cpu|cuda (cpu)]
//       [--layout fsdp|ddp|hsdp (fsdp)] [--reshard 0|1 (1)] [--prefetch 0|1 (1)]
//
// Three timings, each the median over K steps of the slowest rank (the first two interleaved step
// by step, so that drift in the machine's speed affects both alike):
//   step     the real step: forward, backward, gradient reduction, clipping, AdamW, over the
//            world as --layout says (hsdp: 2 replicas);
//   compute  the same step with every collective replaced by a local copy into the same buffers
//            (parallel/local_group.h, of the same size and rank: the same packing, copies and
//            kernels, no communication; its numbers are not a real job's and are thrown away);
//   comm     the step's collectives alone: recorded from a real step (kind, group, size, in
//            order) and replayed back to back on the same groups;
// exposed communication = step - compute (what the step waits for), overlap = 1 - exposed / comm
// (the share of the communication hidden behind compute; 0 when every collective blocks the
// host, as MPI's do on CPU: nonblocking MPI collectives progress only inside MPI calls). Rank 0
// prints a table and one JSON line. Each rank trains on its own packed row of S tokens.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "parallel/fsdp.h"
#include "parallel/local_group.h"
#include "parallel/mesh.h"
#include "parallel/mpi_env.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/device.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/stream.h"
#include "src/train/config.h"
#include "src/train/train_step.h"

using namespace vlm;
using parallel::ProcessGroup;
using parallel::ReduceOp;
using parallel::Work;

namespace {

struct Options {
  int64_t hidden = 256, layers = 4, heads = 4, kv_heads = 2, head_dim = 64, ffn = 768, vocab = 8192,
          seq = 512, steps = 6, warmup = 2, reshard = 1, prefetch = 1;
  std::string dtype = "f32", device = "cpu", layout = "fsdp";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    VLM_CHECK(i + 1 < argc, "bench_fsdp_step: option ", a, " needs a value");
    const std::string v = argv[++i];
    auto num = [&] {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      VLM_CHECK(end && *end == '\0' && !v.empty(), "bench_fsdp_step: ", a,
                " needs an integer, got '", v, "'");
      return int64_t(n);
    };
    if (a == "--hidden")
      o.hidden = num();
    else if (a == "--layers")
      o.layers = num();
    else if (a == "--heads")
      o.heads = num();
    else if (a == "--kv-heads")
      o.kv_heads = num();
    else if (a == "--head-dim")
      o.head_dim = num();
    else if (a == "--ffn")
      o.ffn = num();
    else if (a == "--vocab")
      o.vocab = num();
    else if (a == "--seq")
      o.seq = num();
    else if (a == "--steps")
      o.steps = num();
    else if (a == "--warmup")
      o.warmup = num();
    else if (a == "--reshard")
      o.reshard = num();
    else if (a == "--prefetch")
      o.prefetch = num();
    else if (a == "--dtype")
      o.dtype = v;
    else if (a == "--device")
      o.device = v;
    else if (a == "--layout")
      o.layout = v;
    else
      VLM_FAIL("bench_fsdp_step: unknown option ", a);
  }
  VLM_CHECK(o.dtype == "f32" || o.dtype == "bf16", "bench_fsdp_step: --dtype f32 or bf16");
  VLM_CHECK(o.layout == "fsdp" || o.layout == "ddp" || o.layout == "hsdp",
            "bench_fsdp_step: --layout fsdp, ddp or hsdp");
  VLM_CHECK(o.steps >= 1 && o.warmup >= 0 && o.seq >= 8, "bench_fsdp_step: bad --steps/--seq");
  return o;
}

// One collective as a step issued it.
struct Recorded {
  enum Kind { all_gather, reduce_scatter, all_reduce } kind;
  ProcessGroup* group;
  int64_t numel; // of the larger tensor
  DType dtype;
};

// Forwards every collective to `inner` and records it (the comm replay).
class RecordingGroup final : public ProcessGroup {
public:
  RecordingGroup(ProcessGroup& inner, std::vector<Recorded>& log) : inner_(inner), log_(log) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    log_.push_back({Recorded::all_reduce, &inner_, t.numel(), t.dtype()});
    return inner_.all_reduce_async(t, op);
  }
  std::unique_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    log_.push_back({Recorded::all_gather, &inner_, out.numel(), out.dtype()});
    return inner_.all_gather_async(out, in);
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                             ReduceOp op) override {
    log_.push_back({Recorded::reduce_scatter, &inner_, in.numel(), in.dtype()});
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
  std::unique_ptr<ProcessGroup> split(int, int, const std::string&) const override {
    VLM_FAIL("RecordingGroup::split");
  }

private:
  ProcessGroup& inner_;
  std::vector<Recorded>& log_;
};

// The seq-token row of this rank: 4 documents of random ids.
model::Batch make_batch(const Options& o, int rank) {
  Rng rng(uint64_t(rank) + 1);
  std::vector<int64_t> ids, labels, pos;
  std::vector<int32_t> cu{0};
  for (int d = 0; d < 4; d++) {
    const int64_t len = d == 3 ? o.seq - cu.back() : o.seq / 4;
    for (int64_t t = 0; t < len; t++) {
      ids.push_back(rng.randint(0, o.vocab));
      labels.push_back(t == 0 ? -100 : ids.back());
      pos.push_back(t);
    }
    cu.push_back(int32_t(ids.size()));
  }
  return model::batch_from_labels(Tensor::from_vector(ids, {o.seq}),
                                  Tensor::from_vector(labels, {o.seq}),
                                  Tensor::from_vector(pos, {o.seq}), Tensor::from_vector(cu, {5}));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of fn on the slowest rank.
double timed(ProcessGroup& world, Device device, const std::function<void()>& fn) {
  world.barrier();
  const auto a = std::chrono::steady_clock::now();
  fn();
  synchronize_device(device);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  return world.all_reduce_value(s, ReduceOp::max);
}

} // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const parallel::MpiWorld& w = parallel::require_mpi();
    const int n = w.size;
    const int64_t replicas = o.layout == "ddp" ? n : o.layout == "hsdp" ? 2 : 1;
    VLM_CHECK(n % replicas == 0, "bench_fsdp_step: --layout hsdp needs an even number of ranks");
    parallel::DeviceMesh mesh(parallel::world_group(), {replicas, n / replicas, 1});
    const Device device =
        o.device == "cuda"
            ? parse_device("cuda:" +
                           std::to_string(w.local_rank % std::max(1, cuda_device_count())))
            : Device::cpu();
    check_device_available(device, "--device");

    nlohmann::json mc = model::preset_config("tiny");
    mc["hidden_size"] = o.hidden;
    mc["num_hidden_layers"] = o.layers;
    mc["num_attention_heads"] = o.heads;
    mc["num_key_value_heads"] = o.kv_heads;
    mc["head_dim"] = o.head_dim;
    mc["intermediate_size"] = o.ffn;
    mc["vocab_size"] = o.vocab;
    mc["max_position_embeddings"] = std::max(mc["max_position_embeddings"].get<int64_t>(), o.seq);
    const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;

    train::TrainConfig c;
    c.training.param_dtype = dtype;
    c.training.total_steps = 1000;
    c.training.warmup_steps = 0;
    c.training.scheduler_type = optim::ScheduleType::constant;
    c.training.lr_llm = 1e-4;
    c.training.max_grad_norm = 1.0;
    parallel::FsdpOptions fo;
    fo.reshard_after_forward = o.reshard != 0;
    fo.prefetch = o.prefetch != 0;
    const std::vector<model::Batch> batch{model::to_device(make_batch(o, w.rank), device)};

    // A fresh model sharded over the given groups, with its stepper.
    struct Run {
      std::shared_ptr<model::CausalLM> model;
      std::unique_ptr<parallel::Fsdp> fsdp;
      std::unique_ptr<train::TrainStepper> stepper;
    };
    auto make_run = [&](ProcessGroup& shard, ProcessGroup* replicate, ProcessGroup& dp) {
      Run r;
      r.model = model::build_model(mc, "bench_fsdp_step", dtype);
      Rng rng(0);
      r.model->init_weights(rng);
      r.fsdp = std::make_unique<parallel::Fsdp>(*r.model, r.model->blocks(), shard, replicate, fo,
                                                device);
      r.model->to(device);
      r.stepper =
          std::make_unique<train::TrainStepper>(c, r.model, train::StepParallel{&dp, r.fsdp.get()});
      return r;
    };

    // 1. the real step (its collectives recorded) and 2. compute alone (stand-in groups of the
    // same shape; loss and counts still go over dp), their steps interleaved so that drift in
    // the machine's speed affects both alike.
    std::vector<Recorded> log;
    RecordingGroup rec_shard(mesh.dp_shard(), log), rec_rep(mesh.dp_replicate(), log);
    parallel::LocalProcessGroup local_shard(mesh.dp_shard().rank(), mesh.dp_shard().size());
    parallel::LocalProcessGroup local_rep(mesh.dp_replicate().rank(), mesh.dp_replicate().size());
    Run real = make_run(rec_shard, &rec_rep, mesh.dp());
    Run alone = make_run(local_shard, &local_rep, mesh.dp());
    std::vector<double> step_s, compute_s;
    std::vector<Recorded> one_step;
    for (int64_t s = 0; s < o.warmup + o.steps; s++) {
      log.clear();
      const double t_real = timed(mesh.world(), device, [&] { real.stepper->step(s, batch); });
      one_step = log;
      const double t_alone = timed(mesh.world(), device, [&] { alone.stepper->step(s, batch); });
      if (s >= o.warmup) step_s.push_back(t_real), compute_s.push_back(t_alone);
    }
    const double step = median(step_s), compute = median(compute_s);
    // 3. the recorded collectives alone, back to back
    std::vector<std::pair<Tensor, Tensor>> buffers;
    for (const Recorded& r : one_step) {
      const int64_t k = r.group->size();
      const int64_t small = r.kind == Recorded::all_reduce ? r.numel : r.numel / k;
      buffers.push_back(
          {Tensor::zeros({r.numel}, r.dtype, device), Tensor::zeros({small}, r.dtype, device)});
    }
    std::vector<double> comm_s;
    for (int64_t s = 0; s < o.warmup + o.steps; s++) {
      const double t = timed(mesh.world(), device, [&] {
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
      if (s >= o.warmup) comm_s.push_back(t);
    }
    const double comm = median(comm_s);
    // Below 0 (compute measured slower than the whole step) is the noise of the measurement.
    const double exposed = std::max(0.0, step - compute);
    const double overlap = comm > 0 ? std::clamp(1.0 - exposed / comm, 0.0, 1.0) : 0.0;
    int64_t bytes = 0;
    for (const Recorded& r : one_step) bytes += r.numel * int64_t(dtype_size(r.dtype));
    if (w.rank == 0) {
      std::printf("fsdp step, %d ranks (%s), Qwen3 hidden %lld x %lld layers, vocab %lld, %lld "
                  "tokens per rank, %s on %s, %d threads\n",
                  n, mesh.shape().str().c_str(), (long long)o.hidden, (long long)o.layers,
                  (long long)o.vocab, (long long)o.seq, o.dtype.c_str(), device.str().c_str(),
                  omp_get_max_threads());
      std::printf("  step %.1f ms = compute %.1f ms + exposed communication %.1f ms%s; the step's "
                  "%zu collectives (%.1f MiB) alone take %.1f ms: overlap %.0f%%\n",
                  step * 1e3, compute * 1e3, exposed * 1e3,
                  step < compute ? " (compute measured above the step: noise)" : "",
                  one_step.size(), double(bytes) / double(1 << 20), comm * 1e3, overlap * 100);
      nlohmann::ordered_json j;
      j["ranks"] = n;
      j["layout"] = mesh.shape().str();
      j["device"] = device.str();
      j["dtype"] = o.dtype;
      j["step_ms"] = step * 1e3;
      j["compute_ms"] = compute * 1e3;
      j["exposed_comm_ms"] = exposed * 1e3;
      j["comm_ms"] = comm * 1e3;
      j["overlap"] = overlap;
      j["collectives"] = one_step.size();
      j["comm_bytes"] = bytes;
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
    parallel::abort_job_if_parallel(1);
    return 1;
  }
}
