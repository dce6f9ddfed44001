// `vlmtrain train`: a Qwen3 text model trained on Energon data by a TOML config
// (src/train/config.h), single process for now (FSDP/TP arrive with the parallel issues).
//
//   model      model.preset = "tiny" (random init) or an HF snapshot (model.model_dir), weights
//              loaded by name or HF-initialised (training.random_init)
//   data       the loader of data.train_split (io/loader.h), micro_batch_rows packed rows per
//              micro-step, tpi_multiplier micro-steps per optimizer step (accumulation_pattern)
//   step       src/train/train_step.h (token-mean loss, clipping, AdamW, non-finite policy)
//   eval       every training.eval_steps steps and at the end: token-mean loss and perplexity
//              over eval_batches micro-batches of data.val_split, read from its beginning
//   output     a progress line every logging.log_every steps (step/total, loss, lr, grad norm,
//              tokens/s, ETA); logging.metrics_file: one JSON object per optimizer step and per
//              evaluation; checkpoint.output_dir/checkpoint-step-N/: an HF snapshot (config.json,
//              model.safetensors, tokenizer files) every save_steps and at total_steps; a summary
#pragma once

#include <cstdint>
#include <string>

#include "src/train/config.h"

namespace vlm::train {

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0; // means over the first and the last logging window
  double eval_loss = -1;                // the last evaluation's loss; -1 when there was none
  int64_t real_tokens = 0, padded_tokens = 0;
  int64_t skipped_steps = 0;
  double seconds = 0;
  std::string final_checkpoint; // folder of the last checkpoint written
};

TrainSummary run_training(const TrainConfig& config);

} // namespace vlm::train
