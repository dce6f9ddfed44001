// The 30-step reference loop of tools/golden/gen_train_loop.py, shared by the CPU loop test
// (tests/train/test_train_loop.cpp) and its CUDA twin (tests/train/test_train_gpu.cpp): the tiny
// untied snapshot, the loop's settings and its micro-batches from
// tests/golden/train_loop.safetensors.
#pragma once

#include <memory>
#include <string>

#include "io/state/safetensors.h"
#include "model/model_spec.h"
#include "src/train/config.h"
#include "tests/golden/golden.h"

namespace vlm::testing {

inline const std::string kLoopSnapshot =
    std::string(VLM_SOURCE_DIR) + "/tests/data/qwen3_tiny_untied";
inline const std::string kLoopGolden =
    std::string(VLM_SOURCE_DIR) + "/tests/golden/train_loop.safetensors";

// The snapshot's weights in `dtype`, on `device` (moved before a stepper takes the parameters).
inline std::shared_ptr<model::CausalLM> loop_model(DType dtype = DType::f32,
                                                   Device device = Device::cpu()) {
  auto m = model::load_pretrained(kLoopSnapshot, dtype);
  m->to(device);
  return m;
}

// The reference loop's settings (the golden file's metadata "config").
inline train::TrainConfig loop_config(DType param_dtype = DType::f32) {
  train::TrainConfig c;
  auto& t = c.training;
  t.total_steps = 30;
  t.warmup_steps = 5;
  t.scheduler_type = optim::ScheduleType::cosine;
  t.min_lr_ratio = 0.1;
  t.lr_llm = 3e-3;
  t.adam_beta1 = 0.9;
  t.adam_beta2 = 0.95;
  t.adam_eps = 1e-8;
  t.weight_decay = 0.1;
  t.max_grad_norm = 1.0;
  t.param_dtype = param_dtype;
  return c;
}

// Micro-batch i of the golden file ("mb<i>.*"), on `device`.
inline model::Batch loop_micro_batch(const io::SafetensorsFile& f, int i,
                                     Device device = Device::cpu()) {
  const std::string p = "mb" + std::to_string(i) + ".";
  return model::to_device(model::batch_from_labels(
                              read_tensor(f, p + "input_ids"), read_tensor(f, p + "labels"),
                              read_tensor(f, p + "position_ids"), read_tensor(f, p + "cu_seqlens")),
                          device);
}

} // namespace vlm::testing
