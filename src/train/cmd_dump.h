// `vlmtrain dump`: one forward (+ backward) of an HF snapshot on a given batch, writing logits,
// loss and gradients to safetensors — for parity checks against transformers
// (tools/golden/gen_qwen3.py makes the references, tools/golden/check_export.py compares).
//
//   vlmtrain dump --model DIR --batch FILE --out FILE [--grads] [--dtype f32|bf16]
//                 [--ac off|full|selective] [--device cpu|cuda[:N]]
//                 [--export DIR]
//
// The batch file holds input_ids [T] or [1, T] (i64 or i32), labels (HF-aligned, unshifted, -100
// = ignored, same shape), position_ids (same shape) and cu_seqlens [docs + 1] (i32 or i64). VLM
// keys (pixel_values, image_grid_thw) are ignored with a log line: the text model has no tower.
// The output holds logits [T, vocab] f32, loss (0-dim f32, mean over the valid targets) and, with
// --grads, every parameter's gradient (f32) under its HF name.
#pragma once

#include <string>
#include <vector>

#include "model/qwen3.h"

namespace vlm::train {

struct DumpOptions {
  std::string model_dir;
  std::string batch_path;
  std::string out_path;
  bool grads = false;
  DType dtype = DType::f32; // parameter / compute dtype (f32 or bf16)
  model::ActivationCheckpointing ac = model::ActivationCheckpointing::off;
  std::string export_dir; // also write the loaded model back as an HF snapshot ("" = no)
  Device device = Device::cpu();
};

// Reads a batch file (see above) into a TextBatch; errors name the file and the key.
model::TextBatch read_text_batch(const std::string& path);

struct DumpResult {
  double loss = 0;
  int64_t tokens = 0, targets = 0;
};

// Does the work of `vlmtrain dump` (tests call it directly).
DumpResult run_dump(const DumpOptions& options);

// args: the options after the subcommand name. Returns the process exit code.
int cmd_dump(const std::vector<std::string>& args);

} // namespace vlm::train
