// Kernel launches and host reads of one CUDA training step (TrainStepper::step: forward, backward,
// norm + clip, AdamW), counted by kernels/gpu_runtime.h's launch counters, for the tiny Qwen3
// preset (bf16 parameters with fp32 masters, f32 gradient accumulation, one micro-batch of two
// packed documents) at 2 and 4 decoder layers: the difference gives the launches per layer, the
// rest the fixed part (embedding, final norm, LM head + loss, norm + clip, AdamW). Printed so the
// docs/gpu.md can state them. The bounds:
//   per layer <= 100 kernel launches (the static count of issue 34: ~17 forward + ~50 backward);
//   fixed part <= 200;
//   gradient norm + clipping: at most a handful (3 own launches for up to 1024 tensors);
//   exactly one device-to-host copy and one synchronization per step (the losses and the norm,
//   read together), and no other host read;
//   no upload from pageable memory in a step (the varlen data goes up from pinned staging).
// The counted step is the second (the first one runs every first-use self-check and plan).
// Uploads of the batch's varlen data (src/core/varlen.h, VarlenLayout::device_uploads): the
// counted step repeats the first one's batch, so it uploads none (every layer's forward and
// backward read the data the first step left on the device); a third step on a batch with new
// offsets uploads the same few images at 2 and 4 layers: 2 with the own attention kernels (the
// query tile list, read by the forward and dQ, and the key tile list of dK/dV), 1 with cuDNN (its
// ragged layout), 3 where cuDNN runs the forward but not the backward.
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "model/batch.h"
#include "model/lm_loss.h"
#include "src/core/ops/attention_cudnn.h"
#include "src/core/stream.h"
#include "src/core/varlen.h"
#include "src/optim/grad_clip.h"
#include "src/train/config.h"
#include "src/train/train_step.h"
#include "tests/gpu_testing.h"
#include "tests/train/tiny_step_fixture.h"

using namespace vlm;
using vlm::testing::kGpu;
using vlm::testing::require_device;
using vlm::testing::two_document_batch;

namespace {

constexpr uint64_t kMaxPerLayer = 100;
constexpr uint64_t kMaxFixed = 200;
constexpr uint64_t kMaxClipLaunches = 5;

train::TrainConfig step_config() {
  train::TrainConfig c;
  auto& t = c.training;
  t.param_dtype = DType::bf16;
  t.total_steps = 10;
  t.warmup_steps = 0;
  t.scheduler_type = optim::ScheduleType::constant;
  t.lr_llm = 1e-3;
  t.weight_decay = 0.01;
  t.max_grad_norm = 1.0;
  return c;
}

struct StepCounts {
  kernels::cuda::LaunchCounts step; // the second step (the first one's batch again)
  uint64_t step_varlen_uploads = 0;
  kernels::cuda::LaunchCounts fresh; // the third step (a batch with new offsets)
  uint64_t fresh_varlen_uploads = 0;
  uint64_t fresh_expected_uploads = 0; // for the attention backend that ran (above)
  uint64_t clip_kernels = 0;           // clip_grad_norm_async over the trainable parameters
  kernels::cuda::LaunchCounts clip;
  size_t tensors = 0; // trainable parameters
};

kernels::cuda::LaunchCounts diff(const kernels::cuda::LaunchCounts& a,
                                 const kernels::cuda::LaunchCounts& b) {
  return {b.kernels - a.kernels,       b.library_calls - a.library_calls,
          b.h2d_copies - a.h2d_copies, b.d2h_copies - a.d2h_copies,
          b.syncs - a.syncs,           b.h2d_pageable - a.h2d_pageable};
}

// The varlen images a step on new offsets uploads, from the cuDNN attention calls it made over
// `layers` layers: each layer's forward and backward on cuDNN (2 per layer): its ragged image; the
// own kernels throughout (none): the query and key tile lists; the forward only (1 per layer): the
// ragged image and both tile lists (the own backward reads them).
uint64_t expected_varlen_uploads(int64_t cudnn_runs, int64_t layers) {
  if (cudnn_runs == 2 * layers) return 1;
  return cudnn_runs == layers ? 3 : 2;
}

// `first`: the first document's length in the counted batches (distinct per call, so a model
// does not find another call's device data among the retained layouts).
StepCounts count_step(int64_t layers, int32_t first) {
  auto m = vlm::testing::tiny_bf16_model(int(layers));
  m->to(kGpu);
  const train::TrainConfig c = step_config();
  train::TrainStepper stepper(c, m);
  const std::vector<model::Batch> batch{two_document_batch(m->vocab_size(), 5, first)};
  const std::vector<model::Batch> fresh{two_document_batch(m->vocab_size(), 5, first - 16)};
  stepper.step(0, batch); // first use: self-checks, plans, pools
  synchronize_device(kGpu);

  StepCounts r;
  auto before = kernels::cuda::launch_counts();
  uint64_t uploads = VarlenLayout::device_uploads();
  const train::StepStats st = stepper.step(1, batch);
  r.step = diff(before, kernels::cuda::launch_counts());
  r.step_varlen_uploads = VarlenLayout::device_uploads() - uploads;
  REQUIRE_FALSE(st.skipped);
  REQUIRE(std::isfinite(st.loss));

  before = kernels::cuda::launch_counts();
  uploads = VarlenLayout::device_uploads();
  const int64_t cudnn_runs = ops_detail::cudnn_attention_runs();
  const train::StepStats st_fresh = stepper.step(2, fresh);
  r.fresh = diff(before, kernels::cuda::launch_counts());
  r.fresh_varlen_uploads = VarlenLayout::device_uploads() - uploads;
  r.fresh_expected_uploads =
      expected_varlen_uploads(ops_detail::cudnn_attention_runs() - cudnn_runs, layers);
  REQUIRE_FALSE(st_fresh.skipped);
  REQUIRE(std::isfinite(st_fresh.loss));

  // The norm + clip part alone, on this model's gradients.
  model::lm_loss(*m, batch[0], Reduction::mean).backward();
  r.tensors = stepper.trainable().size();
  const auto c0 = kernels::cuda::launch_counts();
  const Tensor norm = optim::clip_grad_norm_async(stepper.trainable(), 1.0);
  r.clip = diff(c0, kernels::cuda::launch_counts());
  REQUIRE(std::isfinite(norm.to_doubles()[0]));
  stepper.optimizer().zero_grad();
  return r;
}

void print(const char* what, const kernels::cuda::LaunchCounts& c) {
  std::printf("%s: %llu kernel launches, %llu library calls, %llu H2D copies (%llu pageable), "
              "%llu D2H copies, %llu synchronizations\n",
              what, (unsigned long long)c.kernels, (unsigned long long)c.library_calls,
              (unsigned long long)c.h2d_copies, (unsigned long long)c.h2d_pageable,
              (unsigned long long)c.d2h_copies, (unsigned long long)c.syncs);
}

} // namespace

TEST_CASE("gpu launch count: one training step of the tiny Qwen3 stays within its launch bound",
          "[gpu]") {
  require_device();
  const StepCounts two = count_step(2, 40), four = count_step(4, 41);
  print("step, 2 layers", two.step);
  print("step, 4 layers", four.step);
  print("step on new offsets, 2 layers", two.fresh);
  print("step on new offsets, 4 layers", four.fresh);
  print("grad norm + clip (4 layers)", four.clip);
  REQUIRE(four.step.kernels > two.step.kernels);
  const uint64_t per_layer = (four.step.kernels - two.step.kernels) / 2;
  const uint64_t fixed = two.step.kernels - 2 * per_layer;
  const uint64_t lib_per_layer = (four.step.library_calls - two.step.library_calls) / 2;
  std::printf("per layer: %llu kernel launches + %llu library calls; fixed part: %llu kernel "
              "launches + %llu library calls; norm + clip of %zu tensors: %llu launches\n",
              (unsigned long long)per_layer, (unsigned long long)lib_per_layer,
              (unsigned long long)fixed,
              (unsigned long long)(two.step.library_calls - 2 * lib_per_layer), four.tensors,
              (unsigned long long)four.clip.kernels);
  // The per-layer difference is exact: both depths run the same code per layer.
  CHECK((four.step.kernels - two.step.kernels) % 2 == 0);
  CHECK(per_layer <= kMaxPerLayer);
  CHECK(fixed <= kMaxFixed);
  CHECK(four.clip.kernels >= 3);
  CHECK(four.clip.kernels <= kMaxClipLaunches);
  CHECK(four.clip.d2h_copies == 0);
  CHECK(four.clip.syncs == 0);
  for (const StepCounts* s : {&two, &four}) {
    CHECK(s->step.d2h_copies == 1); // the losses and the norm, together
    CHECK(s->step.syncs == 1);
    // The varlen data: none for the batch seen before, a fixed few for new offsets, whatever the
    // depth (O(1), not O(layers)); nothing from pageable memory.
    CHECK(s->step_varlen_uploads == 0);
    CHECK(s->fresh_varlen_uploads == s->fresh_expected_uploads);
    CHECK(s->step.h2d_pageable == 0);
    CHECK(s->fresh.h2d_pageable == 0);
  }
  std::printf(
      "varlen uploads: %llu (2 layers), %llu (4 layers) on new offsets, 0 expected "
      "again on a batch seen before: %llu, %llu\n",
      (unsigned long long)two.fresh_varlen_uploads, (unsigned long long)four.fresh_varlen_uploads,
      (unsigned long long)two.step_varlen_uploads, (unsigned long long)four.step_varlen_uploads);
  CHECK(four.fresh_varlen_uploads == two.fresh_varlen_uploads);
  CHECK(four.fresh.h2d_copies == two.fresh.h2d_copies);
}
