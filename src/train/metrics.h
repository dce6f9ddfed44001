// What the trainer reports: metrics.jsonl (one JSON object per optimizer step and per
// evaluation, losses printed with 17 significant digits so reruns compare bit for bit) and the
// progress line on stdout.
//
// Step record: {"step", "loss", "lr": {"llm": ...}, "grad_norm", "tokens" (real), "padded_tokens",
// "targets", "micro_batches", "tokens_per_s" (real tokens), "tflops" (model FLOPs per second,
// qwen-models.md §7, real tokens only), "mfu" (tflops / logging.peak_tflops; null without a
// peak), "peak_memory_bytes", "elapsed_s", "skipped" (the update was skipped: non-finite),
// "samples_read", "samples_skipped", "skip_reasons" ({"<stage>:<reason>": count}: the loader's
// report, cumulative)}.
// Eval record: {"step", "eval_loss", "eval_ppl", "eval_targets"}.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "io/loader/sample_pipeline.h"
#include "src/train/train_step.h"

namespace vlm::train {

struct StepRecord {
  StepStats stats;
  int64_t real_tokens = 0, padded_tokens = 0;
  double flops = 0;   // model FLOPs of the step
  double seconds = 0; // wall time of the step (data included)
  double elapsed = 0; // since the start of the run
  int64_t peak_memory_bytes = 0;
  double peak_tflops = 0;   // 0: no MFU
  int64_t samples_read = 0; // by the training loader so far
  io::SkipReport skips;     // of the training loader so far
};

class MetricsLog {
public:
  // Creates the file's folder; "" writes nothing. keep_through_step >= 0 (a resumed run): the
  // file's records up to that step are kept and new ones appended (those of later steps, from
  // the run that was interrupted, are dropped); -1: the file starts empty.
  explicit MetricsLog(const std::string& path, int64_t keep_through_step = -1);
  void write_step(const StepRecord& r);
  void write_eval(int64_t step, double loss, int64_t targets);

private:
  std::ofstream out_;
  std::string path_;
};

// Averages over the steps since the last progress line.
class ProgressWindow {
public:
  void add(const StepRecord& r);
  double mean_loss() const;
  // "step  20/300 | loss 4.1234 | lr 3.00e-03 | grad_norm 1.234 | 12345 tok/s | 0.12 TFLOP/s |
  // ETA 1m20s"
  std::string line(int64_t step, int64_t total, double eta_seconds) const;

private:
  double loss_ = 0, seconds_ = 0, flops_ = 0, last_lr_ = 0, last_grad_norm_ = 0;
  int64_t steps_ = 0, counted_ = 0, tokens_ = 0, skipped_ = 0;
};

// "42s", "3m05s", "2h07m".
std::string format_duration(double seconds);

} // namespace vlm::train
