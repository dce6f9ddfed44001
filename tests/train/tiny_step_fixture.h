// Shared by the CUDA step tests (test_launch_count_gpu.cpp, test_step_read_gpu.cpp): the tiny
// Qwen3 preset with `layers` decoder layers in bf16, and a batch of two packed documents on the
// GPU whose ids, targets and offsets are also kept on the host (building and counting the batch
// reads nothing from the device).
#pragma once

#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/batch.h"
#include "model/model_spec.h"
#include "src/base/rng.h"
#include "tests/gpu_testing.h"

namespace vlm::testing {

inline std::shared_ptr<model::CausalLM> tiny_bf16_model(int layers) {
  nlohmann::json config = model::preset_config("tiny");
  config["num_hidden_layers"] = layers;
  auto m = model::build_model(config, "tiny", DType::bf16);
  Rng rng(1);
  m->init_weights(rng);
  return m;
}

// Documents of `first` and 64 - `first` random tokens (seeded), every document's first label
// ignored, moved to the GPU.
inline model::Batch two_document_batch(int64_t vocab, uint64_t seed, int32_t first) {
  Rng rng(seed);
  const std::vector<int32_t> cu = {0, first, 64};
  std::vector<int64_t> ids, labels, pos;
  for (size_t d = 0; d + 1 < cu.size(); d++)
    for (int32_t t = cu[d]; t < cu[d + 1]; t++) {
      ids.push_back(rng.randint(0, vocab));
      labels.push_back(t == cu[d] ? -100 : ids.back());
      pos.push_back(t - cu[d]);
    }
  const int64_t T = cu.back();
  return model::to_device(
      model::batch_from_labels(Tensor::from_vector(ids, {T}), Tensor::from_vector(labels, {T}),
                               Tensor::from_vector(pos, {T}), Tensor::from_vector(cu, {3})),
      kGpu);
}

} // namespace vlm::testing
