// Limits of a Qwen3 `vlmtrain dump` against the transformers golden (tests/golden/
// qwen3_tiny.safetensors): tests/model/test_qwen3_golden.cpp says why each is what it is; the
// CUDA run (tests/gpu/test_gpu_qwen3.cpp) is held to the same.
#pragma once

#include <string>

namespace vlm::testing::qwen3_golden {

constexpr double kLossTol = 1e-6; // fp32 loss, absolute
constexpr double kGradTol = 1e-4; // fp32 gradients, max-norm relative (logits: kGoldenF32Tol)
constexpr double kBf16LogitsTol = 2e-2;
constexpr double kBf16LossTol = 1e-3;
constexpr double kBf16GradTol = 1e-1;

// A file under tests/data/ (the tiny snapshots and batches).
inline std::string data(const std::string& rel) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/" + rel;
}

} // namespace vlm::testing::qwen3_golden
