// Data parallelism on CUDA with the one GPU a test machine has (several GPUs: `mpirun -np N
// bench/bench_collectives --device cuda` and `vlmtrain train` under mpirun):
//   * ProcessGroup on CUDA tensors: NCCL bootstrapped over MPI for a world of one rank, the
//     collectives on the group's communication stream ordered by events after the current
//     stream's work (an op queued just before is seen, the result is seen by the op after);
//   * FSDP on CUDA against the same run on the CPU, for every family: one rank (the DDP path),
//     and two ranks simulated by a LocalProcessGroup (parallel/comm/local_group.h: shards, released
//     and re-acquired whole-parameter buffers, copy-out, packing and reduce-scatter on the GPU;
//     the numbers are the same stand-in's on both devices). f32, 5 steps: losses to 1e-4 and
//     parameters to 1e-3 (L2) relative — cuBLAS and our CPU GEMMs sum in other orders.
// What one GPU cannot cover: FSDP's multi-rank collectives over NCCL (all-gather of shards,
// reduce-scatter of gradients between ranks). NCCL allows one rank per GPU (two ranks on one
// device fail with "Duplicate GPU detected"), and a world of one rank makes no collective on
// tensors (its shards are the whole parameters). On one GPU that path is covered in parts: NCCL's
// collectives by the process-group test below, FSDP's multi-rank logic on CUDA by the stand-in.
// On a machine with two or more GPUs the whole path runs under mpirun (`mpirun -np 2
// bench/bench_fsdp_step --device cuda`, `vlmtrain train` with training.device = "cuda"); the
// FSDP test says so in its output when only one GPU is visible.
// Without NCCL in the build (VLM_WITH_NCCL=OFF or not found) the NCCL tests (the process group's
// and FSDP's one rank over MPI) skip, saying so; the stand-in ranks' FSDP test runs without it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "kernels/nccl.h"

#include "parallel/comm/local_group.h"
#include "parallel/comm/mpi_env.h"
#include "src/core/ops/elementwise.h"
#include "tests/gpu_testing.h"
#include "tests/parallel/fsdp_fixture.h"

using namespace vlm;
using namespace vlm::testing;

namespace {

constexpr int kSteps = 5;

RunResult run_on(Device device, const Family& f, parallel::ProcessGroup& shard) {
  const train::TrainConfig c = equivalence_config();
  const ParallelFamilyModel run =
      parallel_family_model(f, c, {&shard, nullptr, nullptr}, {}, device);
  const auto& m = run.model;
  parallel::Fsdp& fsdp = *run.parallelized.fsdp();
  train::TrainStepper stepper(c, m, run.step_parallel());
  RunResult out;
  for (int s = 0; s < kSteps; s++) {
    std::vector<model::Batch> batches;
    for (int k = 0; k < 2; k++)
      batches.push_back(model::to_device(micro_batch(f, s, shard.rank(), k, 2, 1), device));
    out.losses.push_back(stepper.step(s, batches).loss);
  }
  fsdp.unshard_all();
  for (const auto& p : m->named_parameters()) out.params[p.name] = p.tensor.to_doubles();
  fsdp.reshard_all();
  return out;
}

void check_close(const RunResult& gpu_run, const RunResult& cpu_run) {
  for (int s = 0; s < kSteps; s++) {
    INFO("step " << s + 1);
    CHECK(std::abs(gpu_run.losses[size_t(s)] - cpu_run.losses[size_t(s)]) <=
          1e-4 * std::abs(cpu_run.losses[size_t(s)]) + 1e-6);
  }
  for (const auto& [name, want] : cpu_run.params) {
    INFO(name);
    const std::vector<double>& got = gpu_run.params.at(name);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); i++)
      diff += (got[i] - want[i]) * (got[i] - want[i]), norm += want[i] * want[i];
    CHECK(std::sqrt(diff / std::max(norm, 1e-30)) <= 1e-3);
  }
}

} // namespace

TEST_CASE("gpu process group: NCCL collectives of one rank, ordered with the current stream",
          "[gpu]") {
  require_device();
  if (!kernels::cuda::nccl_built())
    VLM_SKIP("NCCL is not in this build (configure found no nccl.h/libnccl, or VLM_WITH_NCCL=OFF): "
             "the CUDA collectives cannot run; install NCCL (or pip-install nvidia-nccl-cu13) and "
             "reconfigure");
  parallel::require_mpi(); // a world of one over MPI: its CUDA collectives go through NCCL
  auto g = parallel::world_group();
  REQUIRE(g->size() == 1);
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    Tensor x = Tensor::zeros({4, 3}, dtype, kGpu);
    fill_(x, 2.0); // queued on the current stream just before the collective
    Tensor gathered = Tensor::zeros({4, 3}, dtype, kGpu);
    g->all_gather(gathered, x);
    Tensor scattered = Tensor::zeros({4, 3}, dtype, kGpu);
    g->reduce_scatter(scattered, x);
    auto work = g->all_reduce_async(x, parallel::ReduceOp::avg);
    work->wait();
    add_(x, x); // after wait(): sees the all-reduced values
    CHECK(gathered.to_doubles() == std::vector<double>(12, 2.0));
    CHECK(scattered.to_doubles() == std::vector<double>(12, 2.0));
    CHECK(x.to_doubles() == std::vector<double>(12, 4.0));
    CHECK(g->all_reduce_value(3.5) == 3.5);
  }
}

TEST_CASE(
    "gpu fsdp: one rank over MPI and NCCL (the DDP path) on CUDA matches the CPU, every family",
    "[gpu]") {
  require_device();
  if (!kernels::cuda::nccl_built())
    VLM_SKIP("NCCL is not in this build (configure found no nccl.h/libnccl, or VLM_WITH_NCCL=OFF): "
             "a group's CUDA collectives cannot run (the stand-in ranks' test runs without it)");
  if (cuda_device_count() < 2)
    std::printf("gpu fsdp: %d GPU visible: FSDP's multi-rank NCCL collectives are not run here "
                "(NCCL allows one rank per GPU); the multi-rank logic runs on the stand-in group "
                "(see the header of tests/parallel/test_parallel_gpu.cpp)\n",
                cuda_device_count());
  for (const Family& f : all_families()) {
    INFO(f.name);
    parallel::require_mpi();
    auto world = parallel::world_group(); // one rank: the DDP path (no gather, no release)
    check_close(run_on(kGpu, f, *world), run_on(Device::cpu(), f, *world));
  }
}

TEST_CASE("gpu fsdp: two stand-in ranks on CUDA match the CPU, every family", "[gpu]") {
  require_device();
  for (const Family& f : all_families()) {
    INFO(f.name);
    parallel::LocalProcessGroup two(1, 2); // rank 1 of 2: every multi-rank path of FSDP
    check_close(run_on(kGpu, f, two), run_on(Device::cpu(), f, two));
  }
}
