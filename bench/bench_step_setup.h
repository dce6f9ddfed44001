// What the training-step benchmarks share (bench_train_step, bench_fsdp_step, bench_gpu_step,
// bench_vl_step): the size options of a random-init Qwen3 or, instead, a training config
// (--config FILE --set section.key=value, read and described by the trainer's own code), the
// packed batch and its token ids, the TrainConfig of the step, the timed loop of steps
// (bench/timing.h), the figures of its JSON line and its common records.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "model/batch.h"
#include "model/causal_lm.h"
#include "parallel/parallelize.h"
#include "src/cli/args.h"
#include "src/core/tensor.h"
#include "src/train/config.h"
#include "src/train/train_step.h"

namespace vlm::bench {

// The sizes of a random-init Qwen3 (defaults: the benchmark's).
struct ModelSize {
  int64_t hidden, layers, heads, kv_heads, head_dim, ffn, vocab;
};

// --hidden --layers --heads --kv-heads --head-dim --ffn --vocab, each an integer >= 1.
void add_model_size_options(CLI::App& app, ModelSize& s);
inline const std::vector<std::string> kModelSizeFlags = {
    "--hidden", "--layers", "--heads", "--kv-heads", "--head-dim", "--ffn", "--vocab"};

// The tiny preset's config.json (untied head) with the sizes of `s`, its positions covering `seq`
// tokens.
nlohmann::json sized_qwen3_config(const ModelSize& s, int64_t seq);

// A training config instead of the size options: the file and its --set overrides.
struct ConfigOption {
  std::string path;
  std::vector<std::string> sets;
};

// --config FILE and --set section.key=value (repeatable). The config's `settings` stand in for the
// options `replaced` (added before): giving one of them with --config is an error naming both.
void add_config_options(CLI::App& app, ConfigOption& c, const std::string& settings,
                        const std::vector<std::string>& replaced);

// The step of a training config, through the trainer's code: load_train_config (the --set
// overrides applied) and describe_model (a preset or a snapshot's config.json). The benchmark
// builds the model from hf_config with random weights (build_config_model); every part trains (the
// config's train_vit / train_mlp freezing is not applied). Its schedule stays, total_steps raised
// to the `steps` the benchmark runs where the config has fewer.
struct ConfigStep {
  train::TrainConfig config;
  nlohmann::json hf_config;
  int64_t vocab = 0;
  std::vector<int64_t> special_ids; // the model's *_token_id: a batch never draws them
  std::string name;                 // "FILE (model_type)": the records' case
};
ConfigStep load_config_step(const ConfigOption& c, int64_t steps);

// The language model's part of `hf_config` (a vision-language config nests it in text_config).
const nlohmann::json& text_config(const nlohmann::json& hf_config);

// A model of `hf_config` in `dtype` with random weights (Rng seed 0), made parallel over `groups`
// (none: one device) in the trainer's order: described, parallelize() (the family's TP plan when
// groups.tp has more than one rank), then each rank draws only its parts, so no rank holds the
// model whole. `program` names the config in errors.
struct ParallelModel {
  std::shared_ptr<model::CausalLM> model;
  parallel::Parallelized parallelized; // after the model: undone before it goes
};
ParallelModel random_parallel_model(const nlohmann::json& hf_config, DType dtype,
                                    const std::string& program,
                                    const parallel::ParallelGroups& groups,
                                    parallel::ParallelizeOptions options, Device device);

// Token ids from a 64-bit LCG: x = x * 6364136223846793005 + 1442695040888963407 mod 2^64, seed
// 1, id = (x >> 33) % vocab (the PyTorch sides of bench_train_step.sh and bench_gpu_step.sh make
// the same ids).
struct LcgIds {
  int64_t vocab;
  uint64_t x = 1;
  int64_t operator()() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return int64_t((x >> 33) % uint64_t(vocab));
  }
};

// The ids of `next` with every id of `special` redrawn (an image placeholder would need an image).
std::function<int64_t()> avoiding(std::vector<int64_t> special, std::function<int64_t()> next);

// One packed row of `seq` tokens in `docs` documents of seq / docs tokens (the last one takes the
// remainder): ids from `next_id` in order, position ids restarting per document, HF-aligned
// labels = ids with -100 on each document's first token (so no target crosses a document).
model::Batch packed_batch(int64_t seq, int64_t docs, const std::function<int64_t()>& next_id);

// The step the benchmarks time: `dtype` parameters, AdamW (betas 0.9/0.999, eps 1e-8, weight
// decay 0.01 on projection weights) at `lr` constant from the first of `total_steps` steps,
// global gradient-norm clipping to 1.0, no activation checkpointing.
train::TrainConfig step_config(DType dtype, int64_t total_steps, double lr);

// What the timed loop of steps measured.
struct StepTimes {
  std::vector<double> ms;                                    // of each timed step
  double loss_first = 0, grad_norm_first = 0, loss_last = 0; // first warm-up, last timed step
};

// t.warmup + t.iters optimizer steps of `stepper` on `batch`, the last t.iters timed by `timer`.
// A skipped step is an error of `program`.
StepTimes time_steps(train::TrainStepper& stepper, const std::vector<model::Batch>& batch,
                     const Timing& t, const Timer& timer, const std::string& program);

// The figures that close the CPU step benchmarks' JSON line (`tokens` per step): tokens_per_s and
// step_ms at the median step, step_ms_min, threads (omp_get_max_threads), loss_first, loss_last.
void add_step_figures(nlohmann::ordered_json& j, const StepTimes& t, int64_t tokens);

// The common records of a step benchmark (bench/record.h), before its JSON line: the median
// step_ms, the fastest step's, and tokens_per_s at the median.
void emit_step_records(const std::string& benchmark, const std::string& case_name,
                       const std::string& device, const StepTimes& t, int64_t tokens);

} // namespace vlm::bench
