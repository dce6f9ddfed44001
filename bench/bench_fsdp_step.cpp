// One data-parallel training step of a random-init Qwen3 under mpirun, split into compute and
// exposed communication (issue 13):
//
//   mpirun -np N bench/bench_fsdp_step [options]   (--help lists them with their defaults: the
//       model's sizes, S = --seq tokens per rank, K = --steps timed steps after --warmup ones,
//       --dtype f32|bf16, --device cpu|cuda, --layout fsdp|ddp|hsdp, --reshard 0|1, --prefetch 0|1)
//
// Three timings, each the median over K steps (the higher middle one of an even K) of the slowest
// rank (the first two interleaved step by step, so that drift in the machine's speed affects both
// alike):
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
// prints a table and one JSON line. Each rank trains on its own packed row of S tokens (4
// documents, random ids seeded by its rank); the step is bench_step_setup.h's at lr 1e-4.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_step_setup.h"
#include "model/model_spec.h"
#include "parallel/fsdp.h"
#include "parallel/local_group.h"
#include "parallel/mesh.h"
#include "parallel/mpi_env.h"
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
  int64_t seq = 512, steps = 6, warmup = 2, reshard = 1, prefetch = 1;
  std::string dtype = "f32", device = "cpu", layout = "fsdp";
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  bench::add_model_size_options(app, o.size);
  app.add_option("--seq", o.seq, "tokens per rank (4 documents)")->check(cli::at_least(8));
  app.add_option("--steps", o.steps, "timed steps")->check(cli::at_least(1));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(cli::at_least(0));
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
  return bench::packed_batch(o.seq, 4, [&] { return rng.randint(0, o.size.vocab); });
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

// A fresh model sharded over the given groups, with its stepper.
struct Run {
  std::shared_ptr<model::CausalLM> model;
  parallel::Parallelized parallelized;
  std::unique_ptr<train::TrainStepper> stepper;
};

// What every Run is made of.
struct RunSpec {
  nlohmann::json model_config;
  DType dtype;
  train::TrainConfig config;
  parallel::FsdpOptions fsdp;
  Device device;

  Run make(ProcessGroup& shard, ProcessGroup* replicate, ProcessGroup& dp) const {
    Run r;
    r.model = model::build_model(model_config, "bench_fsdp_step", dtype);
    Rng rng(0);
    r.model->init_weights(rng);
    r.parallelized = parallel::parallelize(*r.model, r.model->blocks(), {&shard, replicate, &dp},
                                           {parallel::AcMode::off, fsdp}, device);
    r.stepper = std::make_unique<train::TrainStepper>(config, r.model,
                                                      train::StepParallel::of(r.parallelized));
    return r;
  }
};

// The timed steps of the real and the compute-only runs, and the collectives of a real step.
struct StepAndCompute {
  std::vector<double> step_s, compute_s;
  std::vector<Recorded> one_step;
};

// 1. the real step (its collectives recorded) and 2. compute alone (stand-in groups of the same
// shape; loss and counts still go over dp), their steps interleaved so that drift in the machine's
// speed affects both alike.
StepAndCompute time_step_and_compute(const Options& o, const parallel::DeviceMesh& mesh,
                                     const RunSpec& spec, const std::vector<model::Batch>& batch) {
  std::vector<Recorded> log;
  RecordingGroup rec_shard(mesh.dp_shard(), log), rec_rep(mesh.dp_replicate(), log);
  parallel::LocalProcessGroup local_shard(mesh.dp_shard().rank(), mesh.dp_shard().size());
  parallel::LocalProcessGroup local_rep(mesh.dp_replicate().rank(), mesh.dp_replicate().size());
  Run real = spec.make(rec_shard, &rec_rep, mesh.dp());
  Run alone = spec.make(local_shard, &local_rep, mesh.dp());
  StepAndCompute t;
  for (int64_t s = 0; s < o.warmup + o.steps; s++) {
    log.clear();
    const double t_real = timed(mesh.world(), spec.device, [&] { real.stepper->step(s, batch); });
    t.one_step = log;
    const double t_alone = timed(mesh.world(), spec.device, [&] { alone.stepper->step(s, batch); });
    if (s >= o.warmup) t.step_s.push_back(t_real), t.compute_s.push_back(t_alone);
  }
  return t;
}

// 3. the recorded collectives alone, back to back: the median seconds.
double time_comm(const Options& o, ProcessGroup& world, Device device,
                 const std::vector<Recorded>& one_step) {
  std::vector<std::pair<Tensor, Tensor>> buffers;
  for (const Recorded& r : one_step) {
    const int64_t k = r.group->size();
    const int64_t small = r.kind == Recorded::all_reduce ? r.numel : r.numel / k;
    buffers.push_back(
        {Tensor::zeros({r.numel}, r.dtype, device), Tensor::zeros({small}, r.dtype, device)});
  }
  std::vector<double> comm_s;
  for (int64_t s = 0; s < o.warmup + o.steps; s++) {
    const double t = timed(world, device, [&] {
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
  return bench::upper_median(comm_s);
}

// Rank 0's table and JSON line.
void report(const Options& o, const parallel::DeviceMesh& mesh, Device device, double step,
            double compute, double comm, const std::vector<Recorded>& one_step) {
  // Below 0 (compute measured slower than the whole step) is the noise of the measurement.
  const double exposed = std::max(0.0, step - compute);
  const double overlap = comm > 0 ? std::clamp(1.0 - exposed / comm, 0.0, 1.0) : 0.0;
  int64_t bytes = 0;
  for (const Recorded& r : one_step) bytes += r.numel * int64_t(dtype_size(r.dtype));
  const int n = mesh.world().size();
  std::printf("fsdp step, %d ranks (%s), Qwen3 hidden %lld x %lld layers, vocab %lld, %lld "
              "tokens per rank, %s on %s, %d threads\n",
              n, mesh.shape().str().c_str(), (long long)o.size.hidden, (long long)o.size.layers,
              (long long)o.size.vocab, (long long)o.seq, o.dtype.c_str(), device.str().c_str(),
              omp_get_max_threads());
  std::printf("  step %.1f ms = compute %.1f ms + exposed communication %.1f ms%s; the step's "
              "%zu collectives (%.1f MiB) alone take %.1f ms: overlap %.0f%%\n",
              step * 1e3, compute * 1e3, exposed * 1e3,
              step < compute ? " (compute measured above the step: noise)" : "", one_step.size(),
              double(bytes) / double(1 << 20), comm * 1e3, overlap * 100);
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

int run(const Options& o) {
  const parallel::MpiWorld& w = parallel::require_mpi();
  const int n = w.size;
  const int64_t replicas = o.layout == "ddp" ? n : o.layout == "hsdp" ? 2 : 1;
  VLM_CHECK(n % replicas == 0, "bench_fsdp_step: --layout hsdp needs an even number of ranks");
  parallel::DeviceMesh mesh(parallel::world_group(), {replicas, n / replicas, 1});
  const Device device =
      o.device == "cuda"
          ? parse_device("cuda:" + std::to_string(w.local_rank % std::max(1, cuda_device_count())))
          : Device::cpu();
  check_device_available(device, "--device");

  const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  RunSpec spec{bench::sized_qwen3_config(o.size, o.seq), dtype,
               bench::step_config(dtype, 1000, 1e-4), parallel::FsdpOptions{}, device};
  spec.fsdp.reshard_after_forward = o.reshard != 0;
  spec.fsdp.prefetch = o.prefetch != 0;
  const std::vector<model::Batch> batch{model::to_device(make_batch(o, w.rank), device)};

  const StepAndCompute t = time_step_and_compute(o, mesh, spec, batch);
  const double step = bench::upper_median(t.step_s), compute = bench::upper_median(t.compute_s);
  const double comm = time_comm(o, mesh.world(), device, t.one_step);
  if (w.rank == 0) report(o, mesh, device, step, compute, comm, t.one_step);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"One data-parallel training step under mpirun, split into compute and exposed "
               "communication.",
               "bench_fsdp_step"};
  Options o;
  add_options(app, o);
  return bench::run_main(
      app, argc, argv, [&] { return run(o); }, parallel::abort_job_if_parallel);
}
