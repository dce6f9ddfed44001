// `vlmtrain dump`: one forward (+ backward) of an HF snapshot on a given batch, writing logits,
// loss and gradients to safetensors — for parity checks against transformers
// (tools/golden/gen_qwen3.py makes the references, tools/golden/check_export.py compares).
//
//   vlmtrain dump --model DIR --batch FILE --out FILE [--grads] [--dtype f32|bf16]
//                 [--ac off|full|selective] [--device cpu|cuda[:N]]
//                 [--export DIR]
//
// The batch file holds input_ids [T] or [1, T] (i64 or i32), labels (HF-aligned, unshifted, -100
// = ignored, same shape), position_ids (same shape, or [3, T] / [3, 1, T] for MRoPE) and
// cu_seqlens [docs + 1] (i32 or i64), plus pixel_values and image_grid_thw for a model with a
// vision tower (a text model ignores them with a log line). Any registered model family
// (model/model_spec.h) is dumped by its config.json's model_type.
// The output holds logits [T, vocab] f32, loss (0-dim f32, mean over the valid targets) and, with
// --grads, every parameter's gradient (f32) under its HF name.
#pragma once

#include <string>
#include <vector>

#include "model/batch.h"
#include "parallel/activation_checkpointing.h"
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

// Reads a batch file (see above); errors name the file and the key. Vision keys are read when
// `vision` is set, else ignored with a log line.
model::Batch read_batch_file(const std::string& path, bool vision);

struct DumpResult {
  double loss = 0;
  int64_t tokens = 0, targets = 0;
};

// Does the work of `vlmtrain dump` (tests call it directly).
DumpResult run_dump(const DumpOptions& options);

// args: the options after the subcommand name. Returns the process exit code.
int cmd_dump(const std::vector<std::string>& args);

} // namespace vlm::train
