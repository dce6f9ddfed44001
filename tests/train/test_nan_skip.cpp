// The training step's deferred non-finite check (src/train/train_step.h): AdamW is queued before
// the host knows whether the step is finite, with a device-side skip flag. A skipped step must
// leave the weights and the optimizer state (moments, masters, step counts) bit-identical, the
// next finite step must equal that of a run in which the bad step never happened (the same
// bias-correction t), and the abort policy must throw as before with nothing changed.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "io/state/safetensors.h"
#include "src/train/train_step.h"
#include "tests/error_of.h"
#include "tests/train/loop_fixture.h"
#include "tests/train/step_snapshot.h"

using Catch::Matchers::Contains;
using namespace vlm;
using vlm::testing::check_same;
using vlm::testing::error_of;
using vlm::testing::kLoopGolden;
using vlm::testing::loop_config;
using vlm::testing::loop_micro_batch;
using vlm::testing::loop_model;
using vlm::testing::step_snapshot;
using vlm::testing::StepSnapshot;
using vlm::train::NanPolicy;
using vlm::train::TrainConfig;
using vlm::train::TrainStepper;

namespace {

// A NaN in the final norm's weight: the loss and every gradient upstream go NaN. Returns the
// value it replaced.
float poison(model::CausalLM& m, DType dtype) {
  for (auto& p : m.named_parameters())
    if (p.name == "model.norm.weight") {
      if (dtype == DType::bf16) {
        const float old = float(p.tensor.data<bf16>()[3]);
        p.tensor.data<bf16>()[3] = bf16(NAN);
        return old;
      }
      const float old = p.tensor.data<float>()[3];
      p.tensor.data<float>()[3] = NAN;
      return old;
    }
  FAIL("no model.norm.weight");
  return 0;
}

void restore(model::CausalLM& m, DType dtype, float value) {
  for (auto& p : m.named_parameters())
    if (p.name == "model.norm.weight") {
      if (dtype == DType::bf16)
        p.tensor.data<bf16>()[3] = bf16(value);
      else
        p.tensor.data<float>()[3] = value;
    }
}

} // namespace

TEST_CASE("nan skip: a skipped step changes no weight or optimizer state, and the next step "
          "equals a run without it") {
  io::SafetensorsFile golden(kLoopGolden);
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO("parameters " << dtype_name(dtype));
    TrainConfig c = loop_config(dtype);
    c.training.nan_policy = NanPolicy::skip;
    c.training.max_skipped_steps = 1;
    c.training.max_grad_norm = 0.05; // every step clips: the coefficient path runs too
    // Two micro-batches per step: the guard sums several losses.
    auto mbs = [&](int i) {
      return std::vector<model::Batch>{loop_micro_batch(golden, 2 * i),
                                       loop_micro_batch(golden, 2 * i + 1)};
    };
    auto ma = loop_model(dtype), mb = loop_model(dtype);
    TrainStepper a(c, ma), b(c, mb);

    const train::StepStats a0 = a.step(0, mbs(0)), b0 = b.step(0, mbs(0));
    REQUIRE_FALSE(a0.skipped);
    CHECK(a0.grad_norm > c.training.max_grad_norm);
    CHECK(a0.loss == b0.loss);

    const float kept = poison(*ma, dtype);
    const StepSnapshot before = step_snapshot(a);
    const train::StepStats bad = a.step(1, mbs(1));
    CHECK(bad.skipped);
    CHECK(std::isnan(bad.loss));
    CHECK(a.skipped_steps() == 1);
    check_same(step_snapshot(a), before);
    for (const Tensor& p : a.trainable()) CHECK_FALSE(p.grad().defined()); // dropped
    restore(*ma, dtype, kept);

    // The same step 2 in both: a skipped step 1, b never ran it.
    const train::StepStats a2 = a.step(2, mbs(2)), b2 = b.step(2, mbs(2));
    REQUIRE_FALSE(a2.skipped);
    CHECK(a2.loss == b2.loss);
    CHECK(a2.grad_norm == b2.grad_norm);
    check_same(step_snapshot(a), step_snapshot(b));
    CHECK(a.optimizer().state("model.norm.weight").step == 2);
  }
}

TEST_CASE("nan skip: the abort policy throws as before, with weights and optimizer state as they "
          "were") {
  io::SafetensorsFile golden(kLoopGolden);
  TrainConfig c = loop_config();
  auto m = loop_model();
  TrainStepper stepper(c, m);
  REQUIRE_FALSE(stepper.step(0, {loop_micro_batch(golden, 0)}).skipped);
  poison(*m, DType::f32);
  const StepSnapshot before = step_snapshot(stepper);
  const std::string e = error_of([&] { stepper.step(1, {loop_micro_batch(golden, 1)}); });
  CHECK_THAT(e, Contains("train step 2") && Contains("non-finite value in the loss") &&
                    Contains("nan_policy = \"skip\" skips such steps instead"));
  check_same(step_snapshot(stepper), before);
  CHECK(stepper.skipped_steps() == 0);
}
