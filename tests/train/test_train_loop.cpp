// The training step (src/train/train_step.h) against a PyTorch reference loop
// (tools/golden/gen_train_loop.py: transformers' Qwen3ForCausalLM, torch.optim.AdamW, LambdaLR
// warmup + cosine, clip_grad_norm_, accumulation 2), and its non-finite policies.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>

#include "io/state/safetensors.h"
#include "src/train/train_step.h"
#include "tests/error_of.h"
#include "tests/golden/golden.h"
#include "tests/train/loop_fixture.h"

using Catch::Matchers::Contains;
using vlm::Tensor;
using vlm::model::Batch;
using vlm::testing::error_of;
using vlm::testing::kLoopGolden;
using vlm::testing::loop_config;
using vlm::testing::read_tensor;
using vlm::train::TrainConfig;
using vlm::train::TrainStepper;

namespace {

std::shared_ptr<vlm::model::CausalLM> tiny_model() { return vlm::testing::loop_model(); }

Batch micro_batch(const vlm::io::SafetensorsFile& f, int i) {
  return vlm::testing::loop_micro_batch(f, i);
}

} // namespace

TEST_CASE("train loop: 30 steps reproduce the PyTorch reference loop loss by loss") {
  vlm::io::SafetensorsFile golden(kLoopGolden);
  const auto losses = read_tensor(golden, "losses").to_doubles();
  const auto norms = read_tensor(golden, "grad_norms").to_doubles();
  const auto lrs = read_tensor(golden, "lrs").to_doubles();
  REQUIRE(losses.size() == 30);
  TrainStepper stepper(loop_config(), tiny_model());
  double worst_loss = 0, worst_norm = 0;
  int clipped = 0;
  for (int s = 0; s < 30; s++) {
    auto st = stepper.step(s, {micro_batch(golden, 2 * s), micro_batch(golden, 2 * s + 1)});
    REQUIRE_FALSE(st.skipped);
    CHECK(st.micro_batches == 2);
    CHECK(st.lr == Approx(lrs[size_t(s)]).epsilon(1e-12));
    worst_loss = std::max(worst_loss, std::abs(st.loss - losses[size_t(s)]) / losses[size_t(s)]);
    worst_norm = std::max(worst_norm, std::abs(st.grad_norm - norms[size_t(s)]) / norms[size_t(s)]);
    clipped += norms[size_t(s)] > 1.0;
  }
  INFO("max relative error: loss " << worst_loss << ", grad norm " << worst_norm);
  CHECK(worst_loss <= 1e-4);
  CHECK(worst_norm <= 1e-4);
  CHECK(clipped >= 10);                        // clipping was active
  CHECK(losses.back() < losses.front() - 1.0); // the reference learned: updates matter
}

TEST_CASE("train loop: the step loss is the token mean whatever the micro-batch split") {
  vlm::io::SafetensorsFile golden(kLoopGolden);
  Batch a = micro_batch(golden, 0), b = micro_batch(golden, 1);
  TrainConfig c = loop_config();
  TrainStepper split(c, tiny_model()), one(c, tiny_model());
  // The same tokens as one micro-batch: concatenated, cu_seqlens offset.
  const int64_t ta = a.input_ids.numel(), tb = b.input_ids.numel();
  auto cat = [](const Tensor& x, const Tensor& y) {
    auto v = x.to_doubles(), w = y.to_doubles();
    v.insert(v.end(), w.begin(), w.end());
    return Tensor::from_doubles(v, {int64_t(v.size())}, vlm::DType::i64);
  };
  auto cu_a = a.cu_seqlens.to_doubles(), cu_b = b.cu_seqlens.to_doubles();
  for (size_t i = 1; i < cu_b.size(); i++) cu_a.push_back(cu_b[i] + double(ta));
  Batch ab;
  ab.input_ids = cat(a.input_ids, b.input_ids);
  ab.targets = cat(a.targets, b.targets);
  ab.position_ids = cat(a.position_ids, b.position_ids);
  ab.cu_seqlens = Tensor::from_doubles(cu_a, {int64_t(cu_a.size())}, vlm::DType::i32);
  REQUIRE(ab.input_ids.numel() == ta + tb);
  auto s2 = split.step(0, {a, b});
  auto s1 = one.step(0, {ab});
  CHECK(s1.targets == s2.targets);
  CHECK(s1.loss == Approx(s2.loss).epsilon(1e-6));
  CHECK(s1.grad_norm == Approx(s2.grad_norm).epsilon(1e-5));
}

TEST_CASE("train loop: a non-finite loss aborts naming the step, or is skipped and counted") {
  vlm::io::SafetensorsFile golden(kLoopGolden);
  auto poison = [](vlm::model::CausalLM& m) {
    for (auto& p : m.named_parameters())
      if (p.name == "model.norm.weight") p.tensor.data<float>()[3] = NAN;
  };
  TrainConfig c = loop_config();
  {
    auto m = tiny_model();
    TrainStepper stepper(c, m);
    poison(*m);
    std::string e = error_of([&] { stepper.step(6, {micro_batch(golden, 0)}); });
    CHECK_THAT(e, Contains("train step 7") && Contains("non-finite") && Contains("loss") &&
                      Contains("nan_policy"));
  }
  c.training.nan_policy = vlm::train::NanPolicy::skip;
  c.training.max_skipped_steps = 1;
  auto m = tiny_model();
  TrainStepper stepper(c, m);
  poison(*m);
  Tensor before = m->head_weight().clone();
  auto st = stepper.step(0, {micro_batch(golden, 0)});
  CHECK(st.skipped);
  CHECK(stepper.skipped_steps() == 1);
  CHECK(vlm::testing::rel_error(m->head_weight(), before) == 0); // no update
  CHECK_THAT(error_of([&] { stepper.step(1, {micro_batch(golden, 1)}); }),
             Contains("max_skipped_steps"));
}
