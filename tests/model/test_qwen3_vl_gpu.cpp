// The whole Qwen3-VL model on CUDA: `vlmtrain dump --device cuda` against the same transformers
// golden and limits as the CPU test (tests/model/test_qwen3_vl_golden.cpp: the tiny T2 model,
// the packed image + text row and the text-only row), with activation checkpointing and in bf16.
// The vision path adds LayerNorm, GELU-tanh, the bidirectional varlen attention, the position
// table's gather and weighted sum, and the image scatter (index_add) to what the Qwen3 test runs.
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include "tests/gpu_testing.h"
#include "tests/model/vlm_golden_cases.h"

using namespace vlm;
using namespace vlm::testing::vlm_golden;
using vlm::testing::kGpu;
using vlm::testing::require_device;

TEST_CASE("gpu qwen3_vl: dump on CUDA matches transformers, packed image row and text-only row") {
  require_device();
  for (const char* variant : {"untied", "tied"})
    for (const char* batch : {"packed", "text"}) {
      INFO(variant << " " << batch);
      check_f32(run_case(qwen3_vl(), variant, batch, parallel::AcMode::off, kGpu), qwen3_vl(),
                variant, batch);
    }
}

TEST_CASE("gpu qwen3_vl: activation checkpointing and bf16 on CUDA") {
  require_device();
  check_f32(run_case(qwen3_vl(), "untied", "packed", parallel::AcMode::full, kGpu), qwen3_vl(),
            "untied", "packed");
  check_bf16(run_case(qwen3_vl(), "untied", "packed", parallel::AcMode::off, kGpu, DType::bf16),
             qwen3_vl());
}
