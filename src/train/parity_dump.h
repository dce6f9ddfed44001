// The work of `vlmtrain dump`: one forward (+ backward) of an HF snapshot on a given batch, writing
// logits, loss and gradients to safetensors — for parity checks against transformers
// (tools/golden/gen_qwen3.py makes the references, tools/golden/check_export.py compares).
//
// The batch file: model/batch_file.h (a text model ignores image keys with a log line). Any
// registered model family (model/model_spec.h) is dumped by its config.json's model_type. The
// output holds logits [T, vocab] f32, loss (0-dim f32, mean over the valid targets) and, with
// --grads, every parameter's gradient (f32) under its HF name.
#pragma once

#include <string>

#include "parallel/ac/activation_checkpointing.h"
#include "src/core/device.h"

namespace vlm::train {

struct DumpOptions {
  std::string model_dir;
  std::string batch_path;
  std::string out_path;
  bool grads = false;
  DType dtype = DType::f32; // parameter / compute dtype (f32 or bf16)
  parallel::AcMode ac = parallel::AcMode::off;
  std::string export_dir; // also write the loaded model back as an HF snapshot ("" = no)
  Device device = Device::cpu();
};

struct DumpResult {
  double loss = 0;
  int64_t tokens = 0, targets = 0;
};

// One forward (+ backward) written to options.out_path.
DumpResult run_dump(const DumpOptions& options);

} // namespace vlm::train
