// The CUDA training step's host reads (issue 34: "no host read of device memory inside a step
// except one deferred read"), counted by kernels/gpu_runtime.h's counters, on the tiny Qwen3
// preset with clipping active at every step:
//   * without FSDP and with FSDP over one rank (a LocalProcessGroup: the shard-group all-reduce of
//     the norm is a device op), a finite step makes exactly one device-to-host copy and one
//     synchronization: the losses, the norm and the skip flag, read together after AdamW is
//     queued;
//   * a non-finite step (nan_policy skip) leaves every parameter, master and moment bit-identical
//     and the step counts where they were: AdamW's kernels read the device-side flag.
// The counted step is the second (the first runs the first-use self-checks and plans).
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "model/batch.h"
#include "parallel/comm/local_group.h"
#include "parallel/parallelize.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/stream.h"
#include "src/train/config.h"
#include "src/train/train_step.h"
#include "tests/gpu_testing.h"
#include "tests/train/step_snapshot.h"
#include "tests/train/tiny_step_fixture.h"

using namespace vlm;
using vlm::testing::kGpu;
using vlm::testing::require_device;

namespace {

train::TrainConfig step_config() {
  train::TrainConfig c;
  auto& t = c.training;
  t.param_dtype = DType::bf16;
  t.total_steps = 10;
  t.warmup_steps = 0;
  t.scheduler_type = optim::ScheduleType::constant;
  t.lr_llm = 1e-3;
  t.weight_decay = 0.01;
  t.max_grad_norm = 1e-3; // far below the norm: every step clips
  t.nan_policy = train::NanPolicy::skip;
  t.max_skipped_steps = 5;
  return c;
}

// Two packed documents of 40 and 24 random tokens.
model::Batch make_batch(int64_t vocab, uint64_t seed) {
  return vlm::testing::two_document_batch(vocab, seed, 40);
}

// Device reads of step 1 (after a warm-up step 0), two micro-batches.
kernels::cuda::LaunchCounts counted_step(train::TrainStepper& stepper, int64_t vocab) {
  stepper.step(0, {make_batch(vocab, 1), make_batch(vocab, 2)});
  synchronize_device(kGpu);
  const std::vector<model::Batch> batches{make_batch(vocab, 3), make_batch(vocab, 4)};
  const auto before = kernels::cuda::launch_counts();
  const train::StepStats st = stepper.step(1, batches);
  const auto after = kernels::cuda::launch_counts();
  REQUIRE_FALSE(st.skipped);
  REQUIRE(std::isfinite(st.loss));
  CHECK(st.grad_norm > 1e-3); // clipped
  kernels::cuda::LaunchCounts d;
  d.d2h_copies = after.d2h_copies - before.d2h_copies;
  d.syncs = after.syncs - before.syncs;
  return d;
}

} // namespace

TEST_CASE("gpu step reads: one device-to-host copy per step, with and without FSDP", "[gpu]") {
  require_device();
  const train::TrainConfig c = step_config();
  SECTION("one process") {
    auto m = vlm::testing::tiny_bf16_model(2);
    m->to(kGpu);
    train::TrainStepper stepper(c, m);
    const auto d = counted_step(stepper, m->vocab_size());
    CHECK(d.d2h_copies == 1);
    CHECK(d.syncs == 1);
  }
  SECTION("FSDP over one rank") {
    auto m = vlm::testing::tiny_bf16_model(2);
    parallel::LocalProcessGroup shard(0, 1);
    const parallel::Parallelized par =
        parallel::parallelize(*m, m->blocks(), {&shard, nullptr, nullptr}, {}, kGpu);
    train::TrainStepper stepper(c, m, par);
    const auto d = counted_step(stepper, m->vocab_size());
    CHECK(d.d2h_copies == 1);
    CHECK(d.syncs == 1);
  }
}

TEST_CASE("gpu step reads: a skipped non-finite step changes no parameter or optimizer state",
          "[gpu]") {
  require_device();
  const train::TrainConfig c = step_config();
  auto m = vlm::testing::tiny_bf16_model(2);
  m->to(kGpu);
  train::TrainStepper stepper(c, m);
  const int64_t vocab = m->vocab_size();
  REQUIRE_FALSE(stepper.step(0, {make_batch(vocab, 1)}).skipped);
  Tensor norm; // a handle on the parameter's storage
  for (const auto& p : m->named_parameters())
    if (p.name == "model.norm.weight") norm = p.tensor.detach();
  REQUIRE(norm.defined());
  const Tensor kept = norm.clone();
  fill_(norm, std::numeric_limits<double>::quiet_NaN());
  const testing::StepSnapshot before = testing::step_snapshot(stepper);
  const train::StepStats bad = stepper.step(1, {make_batch(vocab, 2)});
  CHECK(bad.skipped);
  testing::check_same(testing::step_snapshot(stepper), before);
  copy_(norm, kept);
  const train::StepStats next = stepper.step(2, {make_batch(vocab, 3)});
  CHECK_FALSE(next.skipped);
  CHECK(stepper.optimizer().state("model.norm.weight").step == 2);
}
