#include "src/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "io/loader.h"
#include "io/tokenizer.h"
#include "model/flops.h"
#include "model/hf_weights.h"
#include "model/qwen3.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/allocator.h"
#include "src/train/batches.h"
#include "src/train/metrics.h"
#include "src/train/train_step.h"

namespace vlm::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// What this build cannot do yet: refuse it at start rather than train something else.
void check_supported(const TrainConfig& c) {
  VLM_CHECK(c.parallel.tp_size == 1, "config: parallel.tp_size = ", c.parallel.tp_size,
            ": tensor parallelism is not implemented yet (single process only)");
  VLM_CHECK(c.checkpoint.format == CheckpointFormat::safetensors,
            "config: checkpoint.format = \"hdf5\": HDF5 checkpoints are not implemented yet; use "
            "\"safetensors\"");
  VLM_CHECK(
      !c.checkpoint.resume_checkpoint,
      "config: checkpoint.resume_checkpoint = true: resuming needs the optimizer and loader "
      "state in the checkpoint, which arrives with the HDF5 checkpoints; not implemented yet");
  VLM_CHECK(!c.data.data_path.empty(), "config: data.data_path is required");
  VLM_CHECK(!c.model.tokenizer.empty(),
            "config: model.tokenizer is required (with model.preset there is no snapshot to take "
            "it from)");
}

model::Qwen3Config model_config(const TrainConfig& c, const io::Tokenizer& tok) {
  model::Qwen3Config mc;
  if (!c.model.preset.empty()) {
    VLM_CHECK(c.model.preset == "tiny", "config: model.preset = \"", c.model.preset,
              "\": the only preset is \"tiny\"");
    mc = model::tiny_qwen3_config();
    // The tokenizer decides the vocabulary: at least T1's 512 rows, a multiple of 64.
    mc.vocab_size = std::max<int64_t>(mc.vocab_size, (tok.vocab_size() + 63) / 64 * 64);
  } else {
    mc = model::Qwen3Config::load(c.model.model_dir);
  }
  VLM_CHECK(tok.vocab_size() <= mc.vocab_size, "the tokenizer '", c.model.tokenizer, "' has ",
            tok.vocab_size(), " tokens but the model's vocab_size is ", mc.vocab_size);
  return mc;
}

std::string tokenizer_dir(const std::string& path) {
  return fs::is_directory(path) ? path : fs::path(path).parent_path().string();
}

std::string checkpoint_dir(const TrainConfig& c, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-step-%lld", (long long)step);
  return (fs::path(c.checkpoint.output_dir) / name).string();
}

// micro_batch_rows rows from the loader as one micro-batch, with the rows' token counts and
// FLOPs; nullopt when the data ended first.
struct MicroBatch {
  model::TextBatch batch;
  int64_t real_tokens = 0, padded_tokens = 0;
  double flops = 0;
};

std::optional<MicroBatch> next_micro_batch(io::DataLoader& loader, int64_t rows,
                                           const model::Qwen3Config& mc, Device device) {
  std::vector<io::PackedRow> got;
  MicroBatch mb;
  for (int64_t r = 0; r < rows; r++) {
    auto row = loader.next();
    if (!row) return std::nullopt;
    mb.real_tokens += row->real_tokens;
    mb.padded_tokens += row->pad_tokens;
    mb.flops += model::qwen3_training_flops(mc, row->cu_seqlens, row->num_docs).total();
    got.push_back(std::move(*row));
  }
  mb.batch = model::to_device(text_batch_from_rows(got), device);
  return mb;
}

} // namespace

TrainSummary run_training(const TrainConfig& c) {
  check_supported(c);
  const TrainingOptions& t = c.training;
  const auto start = Clock::now();

  const Device device = parse_device(t.device);
  check_device_available(device, "config: training.device");
  Allocator& device_memory = allocator_for(device);
  io::Tokenizer tok = io::Tokenizer::from_file(c.model.tokenizer);
  const model::Qwen3Config mc = model_config(c, tok);
  auto model = std::make_shared<model::Qwen3ForCausalLM>(mc, t.param_dtype);
  if (t.random_init || !c.model.preset.empty()) {
    Rng rng(uint64_t(t.seed));
    model->init_weights(rng);
  } else {
    model::load_hf_weights(*model, c.model.model_dir);
  }
  model->to(device); // initialized or loaded on the host (Module::to)
  const double peak_tflops =
      c.logging.peak_tflops > 0 ? c.logging.peak_tflops : device_peak_tflops(device);
  TrainStepper stepper(c, model);
  const std::vector<int> pattern = accumulation_pattern(t.tpi_multiplier);

  io::DataLoader loader(text_loader_config(c, tok, c.model.tokenizer, c.data.train_split, true),
                        tok);
  // Validation data is read from its beginning at every evaluation.
  auto val_loader = [&] {
    return std::make_unique<io::DataLoader>(
        text_loader_config(c, tok, c.model.tokenizer, c.data.val_split, false), tok);
  };
  if (t.eval_steps > 0) val_loader(); // a missing val split fails now, not after hours

  MetricsLog metrics(c.logging.metrics_file);
  log_info("train: ", c.model.model_name.empty() ? mc.summary() : c.model.model_name, ", ",
           model->num_parameters(), " parameters (", dtype_name(t.param_dtype), "), ",
           t.total_steps, " steps on ", device.str(), " of ", c.data.seq_len, "-token rows x ",
           t.micro_batch_rows, " x tpi ", t.tpi_multiplier, ", data ", c.data.data_path);

  TrainSummary sum;
  auto evaluate = [&](int64_t step) {
    auto val = val_loader();
    std::vector<model::TextBatch> batches;
    for (int64_t i = 0; t.eval_batches == 0 || i < t.eval_batches; i++) {
      auto mb = next_micro_batch(*val, t.micro_batch_rows, mc, device);
      if (!mb) break;
      batches.push_back(std::move(mb->batch));
    }
    VLM_CHECK(!batches.empty(), "eval: data.val_split '", c.data.val_split,
              "' gave no complete micro-batch of ", t.micro_batch_rows, " rows");
    auto [loss_sum, targets] = stepper.evaluate(batches);
    const double loss = targets > 0 ? loss_sum / double(targets) : 0.0;
    sum.eval_loss = loss;
    metrics.write_eval(step, loss, targets);
    if (c.logging.progress)
      std::printf("eval  %lld/%lld | loss %.4f | ppl %.2f | %lld tokens\n", (long long)step,
                  (long long)t.total_steps, loss, std::exp(loss), (long long)targets);
  };
  auto save = [&](int64_t step) {
    sum.final_checkpoint = checkpoint_dir(c, step);
    model::save_hf_snapshot(*model, mc, sum.final_checkpoint, t.param_dtype,
                            tokenizer_dir(c.model.tokenizer));
    log_info("saved ", sum.final_checkpoint);
  };

  ProgressWindow window;
  const auto train_start = Clock::now();
  for (int64_t step = 0; step < t.total_steps; step++) {
    const auto step_start = Clock::now();
    const int micro = pattern[size_t(step) % pattern.size()];
    std::vector<model::TextBatch> batches;
    StepRecord rec;
    for (int m = 0; m < micro; m++) {
      auto mb = next_micro_batch(loader, t.micro_batch_rows, mc, device);
      VLM_CHECK(mb, "train step ", step + 1, ": data.train_split '", c.data.train_split,
                "' ended (data.epochs = ", c.data.epochs,
                ") before training.total_steps = ", t.total_steps);
      rec.real_tokens += mb->real_tokens;
      rec.padded_tokens += mb->padded_tokens;
      rec.flops += mb->flops;
      batches.push_back(std::move(mb->batch));
    }
    rec.stats = stepper.step(step, batches);
    rec.seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    rec.elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    rec.peak_memory_bytes = int64_t(device_memory.stats().peak_bytes);
    rec.peak_tflops = peak_tflops;
    metrics.write_step(rec);
    sum.real_tokens += rec.real_tokens;
    sum.padded_tokens += rec.padded_tokens;
    window.add(rec);

    const bool last = step + 1 == t.total_steps;
    if ((step + 1) % c.logging.log_every == 0 || last) {
      const double mean = window.mean_loss();
      if (step + 1 <= c.logging.log_every) sum.first_loss = mean;
      sum.last_loss = mean;
      const double done = std::chrono::duration<double>(Clock::now() - train_start).count();
      if (c.logging.progress)
        std::printf("%s\n", window
                                .line(step + 1, t.total_steps,
                                      done / double(step + 1) * double(t.total_steps - step - 1))
                                .c_str());
      std::fflush(stdout);
      window = ProgressWindow();
    }
    if (t.eval_steps > 0 && ((step + 1) % t.eval_steps == 0 || last)) evaluate(step + 1);
    if (last || (c.checkpoint.save_steps > 0 && (step + 1) % c.checkpoint.save_steps == 0))
      save(step + 1);
  }
  sum.steps = t.total_steps;
  sum.skipped_steps = stepper.skipped_steps();
  sum.seconds = std::chrono::duration<double>(Clock::now() - start).count();

  const double train_s = std::chrono::duration<double>(Clock::now() - train_start).count();
  std::printf("train done: %lld steps in %s, loss %.4f -> %.4f", (long long)sum.steps,
              format_duration(sum.seconds).c_str(), sum.first_loss, sum.last_loss);
  if (sum.eval_loss >= 0)
    std::printf(", eval loss %.4f (ppl %.2f)", sum.eval_loss, std::exp(sum.eval_loss));
  std::printf("\n  %lld real tokens (%.1f%% padding), %.0f tokens/s, peak tensor memory %.1f MiB, "
              "%lld skipped steps\n  checkpoint %s, metrics %s\n",
              (long long)sum.real_tokens,
              100.0 * double(sum.padded_tokens) /
                  double(std::max<int64_t>(1, sum.real_tokens + sum.padded_tokens)),
              double(sum.real_tokens) / std::max(train_s, 1e-9),
              double(device_memory.stats().peak_bytes) / (1 << 20), (long long)sum.skipped_steps,
              sum.final_checkpoint.c_str(), c.logging.metrics_file.c_str());
  return sum;
}

} // namespace vlm::train
