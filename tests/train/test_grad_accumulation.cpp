// Gradients of bf16 parameters accumulate in fp32 across micro-batches by default
// (training.grad_dtype, Tensor::set_grad_dtype), as PyTorch AMP and FSDP2 mixed precision do:
// each micro-batch's gradient is added without rounding the running sum to 8 bits (and a bf16
// Linear's weight gradient reaches the sum from the GEMM in fp32, without a bf16 rounding).
#include <catch2/catch.hpp>

#include <cmath>

#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "src/core/ops/elementwise.h"
#include "src/train/train_step.h"
#include "tests/train/loop_fixture.h"

using namespace vlm;

namespace {

// The tiny golden snapshot in bf16 and its first micro-batch.
struct Setup {
  std::shared_ptr<model::CausalLM> m = testing::loop_model(DType::bf16);
  io::SafetensorsFile golden{testing::kLoopGolden};
  model::Batch batch = testing::loop_micro_batch(golden, 0);
};

// Backward of the step loss over `batches` (each micro-batch's sum / all targets, as
// TrainStepper does), gradients accumulating in `grad_dtype`; returns them in f64.
std::vector<std::vector<double>>
step_grads(model::CausalLM& m, const std::vector<model::Batch>& batches, DType grad_dtype) {
  int64_t targets = 0;
  for (const auto& b : batches) targets += model::count_targets(b);
  for (const auto& p : m.named_parameters()) {
    Tensor t = p.tensor;
    t.set_grad_dtype(grad_dtype);
    t.zero_grad();
  }
  for (const auto& b : batches)
    affine(model::lm_loss(m, b, Reduction::sum), 1.0 / double(targets)).backward();
  std::vector<std::vector<double>> out;
  for (const auto& p : m.named_parameters()) {
    REQUIRE(p.tensor.grad().dtype() == grad_dtype);
    out.push_back(p.tensor.grad().to_doubles());
  }
  return out;
}

// max |a - b| / max |b| over all parameters.
double rel_diff(const std::vector<std::vector<double>>& a,
                const std::vector<std::vector<double>>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); i++)
    for (size_t j = 0; j < a[i].size(); j++) {
      diff = std::max(diff, std::abs(a[i][j] - b[i][j]));
      ref = std::max(ref, std::abs(b[i][j]));
    }
  return diff / ref;
}

} // namespace

TEST_CASE("grad accumulation: 8 micro-batches in fp32 give one micro-batch's bf16 gradients") {
  // The same micro-batch 8 times with the step's loss scaled by 1/(8n) vs once at 1/n: every
  // micro-batch gradient is the single one / 8 (an exact power-of-two scale), so the fp32 sum of
  // the 8 is exact — and the bf16 sum is not (3/8, 5/8, 7/8 of a bf16 value need more bits).
  Setup s;
  const auto once = step_grads(*s.m, {s.batch}, DType::f32);
  const std::vector<model::Batch> eight(8, s.batch);
  const double f32 = rel_diff(step_grads(*s.m, eight, DType::f32), once);
  const double bf16 = rel_diff(step_grads(*s.m, eight, DType::bf16), once);
  std::printf("8 equal micro-batches vs 1: fp32 accumulation %.2e, bf16 accumulation %.2e\n", f32,
              bf16);
  CHECK(f32 <= 1e-6);
  CHECK(bf16 > 1e-4); // the mode that rounds each add to 8 bits does differ
}

TEST_CASE("grad accumulation: fp32 accumulation is the exact sum of the micro-batch gradients") {
  // 8 different micro-batches: the accumulated gradient against the f64 sum of each
  // micro-batch's own gradient, computed as the fp32 step computes it (weight gradients of bf16
  // Linear parameters straight from the GEMM in fp32, autograd's accumulate_weight_grad). fp32
  // adds them without loss; bf16 rounds every add.
  Setup s;
  std::vector<model::Batch> batches;
  for (int i = 0; i < 8; i++) batches.push_back(testing::loop_micro_batch(s.golden, i));
  int64_t targets = 0;
  for (const auto& b : batches) targets += model::count_targets(b);
  std::vector<std::vector<double>> exact;
  for (const auto& p : s.m->named_parameters()) {
    Tensor t = p.tensor;
    t.set_grad_dtype(DType::f32);
  }
  for (const auto& b : batches) {
    s.m->zero_grad();
    affine(model::lm_loss(*s.m, b, Reduction::sum), 1.0 / double(targets)).backward();
    const auto params = s.m->named_parameters();
    if (exact.empty()) exact.resize(params.size());
    for (size_t i = 0; i < params.size(); i++) {
      const auto g = params[i].tensor.grad().to_doubles(); // one micro-batch's, as in the step
      exact[i].resize(g.size());
      for (size_t j = 0; j < g.size(); j++) exact[i][j] += g[j];
    }
  }
  const double f32 = rel_diff(step_grads(*s.m, batches, DType::f32), exact);
  const double bf16 = rel_diff(step_grads(*s.m, batches, DType::bf16), exact);
  std::printf("8 micro-batches vs the f64 sum of their gradients: fp32 %.2e, bf16 %.2e\n", f32,
              bf16);
  CHECK(f32 <= 1e-6);
  CHECK(bf16 > 1e-4);
}

TEST_CASE("grad accumulation: the stepper accumulates bf16 parameters' gradients as configured") {
  for (DType want : {DType::f32, DType::bf16}) {
    INFO(dtype_name(want));
    train::TrainConfig c = testing::loop_config(DType::bf16);
    c.training.grad_dtype = want;
    auto m = testing::loop_model(DType::bf16);
    train::TrainStepper stepper(c, m);
    for (const Tensor& p : stepper.trainable()) CHECK(p.grad_dtype() == want);
    io::SafetensorsFile golden(testing::kLoopGolden);
    const auto st = stepper.step(
        0, {testing::loop_micro_batch(golden, 0), testing::loop_micro_batch(golden, 1)});
    CHECK_FALSE(st.skipped);
    CHECK(std::isfinite(st.grad_norm));
  }
}
