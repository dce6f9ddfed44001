// The whole Qwen3-VL model on CUDA: `vlmtrain dump --device cuda` against the same transformers
// golden and limits as the CPU test (tests/model/test_qwen3_vl_golden.cpp: the tiny T2 model,
// the packed image + text row and the text-only row), with activation checkpointing and in bf16.
// The vision path adds LayerNorm, GELU-tanh, the bidirectional varlen attention, the position
// table's gather and weighted sum, and the image scatter (index_add) to what the Qwen3 test runs.
// bf16 vs the fp32 golden: at most ~3x what the bf16 CPU run shows against it
// (tests/model/test_qwen3_vl_golden.cpp, observed untied / tied: logits 1.1e-2 / 9.3e-3, loss
// 1.4e-4 / 1.8e-4 absolute, gradients 3.1e-2 / 3.5e-2): logits <= 3e-2 (2.7x), loss <= 5e-4
// (2.8x), gradients <= 8e-2 (2.3x); and every one of the 122 gradients compared.
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include "tests/gpu_testing.h"
#include "tests/model/vlm_golden_cases.h"

using namespace vlm;
using namespace vlm::testing::vlm_golden;
using vlm::testing::kGpu;
using vlm::testing::require_device;

namespace {
constexpr double kGpuBf16LogitsTol = 3e-2;
constexpr double kGpuBf16LossTol = 5e-4;
constexpr double kGpuBf16GradTol = 8e-2;
} // namespace

TEST_CASE("gpu qwen3_vl: dump on CUDA matches transformers, packed image row and text-only row",
          "[gpu]") {
  require_device();
  for (const char* variant : {"untied", "tied"})
    for (const char* batch : {"packed", "text"}) {
      INFO(variant << " " << batch);
      check_f32(run_case(qwen3_vl(), variant, batch, parallel::AcMode::off, kGpu), qwen3_vl(),
                variant, batch);
    }
}

TEST_CASE("gpu qwen3_vl: activation checkpointing and bf16 on CUDA", "[gpu]") {
  require_device();
  check_f32(run_case(qwen3_vl(), "untied", "packed", parallel::AcMode::full, kGpu), qwen3_vl(),
            "untied", "packed");
  const Errors e =
      run_case(qwen3_vl(), "untied", "packed", parallel::AcMode::off, kGpu, DType::bf16);
  CHECK(e.logits <= kGpuBf16LogitsTol);
  CHECK(e.loss <= kGpuBf16LossTol);
  CHECK(e.worst_grad <= kGpuBf16GradTol);
  // Every parameter's gradient was compared (a packed row with images: none is left at zero).
  CHECK(e.zero_vision_grads == 0u);
  CHECK(e.grads_compared == qwen3_vl().params.at("untied"));
  CHECK(e.grads_compared == 122u);
}
