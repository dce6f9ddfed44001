// A Qwen3 `vlmtrain dump` of a golden case and its limits against the transformers golden
// (tests/golden/qwen3_tiny.safetensors): tests/model/test_qwen3_golden.cpp says why each limit is
// what it is; the CUDA run (tests/model/test_qwen3_gpu.cpp) is held to the same.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "io/state/safetensors.h"
#include "src/train/parity_dump.h"
#include "tests/golden/golden.h"
#include "tests/temp_dir.h"

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

// `vlmtrain dump` (run_dump) of the tiny `variant` snapshot ("untied" | "tied") on the batch file
// tests/data/qwen3_tiny_batches/<batch>.safetensors: logits, loss and with `grads` every
// parameter gradient, as CPU tensors. Checks that the output says it ran on `device`.
inline std::map<std::string, Tensor> dump_golden_case(const std::string& variant,
                                                      const std::string& batch, DType dtype,
                                                      bool grads, parallel::AcMode ac,
                                                      Device device) {
  TempDir tmp("qwen3_dump");
  train::DumpOptions o;
  o.model_dir = data("qwen3_tiny_" + variant);
  o.batch_path = data("qwen3_tiny_batches/" + batch + ".safetensors");
  o.out_path = tmp.file("dump.safetensors");
  o.grads = grads;
  o.dtype = dtype;
  o.ac = ac;
  o.device = device;
  train::run_dump(o);
  // A dump that silently stayed on the CPU would pass a CUDA test against the golden.
  CHECK(io::SafetensorsFile(o.out_path).metadata().at("device") == device.str());
  return read_all_tensors(o.out_path);
}

} // namespace vlm::testing::qwen3_golden
