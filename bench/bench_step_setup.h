// What the training-step benchmarks share (bench_train_step, bench_fsdp_step, bench_gpu_step,
// bench_vl_step): the size options of a random-init Qwen3, the packed batch and its LCG token ids,
// the TrainConfig of the step, the timed loop of steps, the figures of its JSON line and its
// common records.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/median.h"
#include "bench/record.h"
#include "model/batch.h"
#include "model/model_spec.h"
#include "src/base/check.h"
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
inline void add_model_size_options(CLI::App& app, ModelSize& s) {
  app.add_option("--hidden", s.hidden, "hidden size")->check(cli::at_least(1));
  app.add_option("--layers", s.layers, "decoder layers")->check(cli::at_least(1));
  app.add_option("--heads", s.heads, "query heads")->check(cli::at_least(1));
  app.add_option("--kv-heads", s.kv_heads, "key/value heads")->check(cli::at_least(1));
  app.add_option("--head-dim", s.head_dim, "head dimension")->check(cli::at_least(1));
  app.add_option("--ffn", s.ffn, "MLP intermediate size")->check(cli::at_least(1));
  app.add_option("--vocab", s.vocab, "vocabulary size")->check(cli::at_least(1));
}

// The tiny preset's config.json (untied head) with the sizes of `s`, its positions covering `seq`
// tokens.
inline nlohmann::json sized_qwen3_config(const ModelSize& s, int64_t seq) {
  nlohmann::json mc = model::preset_config("tiny");
  mc["hidden_size"] = s.hidden;
  mc["num_hidden_layers"] = s.layers;
  mc["num_attention_heads"] = s.heads;
  mc["num_key_value_heads"] = s.kv_heads;
  mc["head_dim"] = s.head_dim;
  mc["intermediate_size"] = s.ffn;
  mc["vocab_size"] = s.vocab;
  mc["max_position_embeddings"] = std::max(mc["max_position_embeddings"].get<int64_t>(), seq);
  return mc;
}

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

// One packed row of `seq` tokens in `docs` documents of seq / docs tokens (the last one takes the
// remainder): ids from `next_id` in order, position ids restarting per document, HF-aligned
// labels = ids with -100 on each document's first token (so no target crosses a document).
inline model::Batch packed_batch(int64_t seq, int64_t docs,
                                 const std::function<int64_t()>& next_id) {
  const auto n = static_cast<size_t>(seq);
  std::vector<int64_t> ids(n), labels(n), pos(n);
  std::vector<int32_t> cu{0};
  const int64_t len = seq / docs;
  for (int64_t d = 0; d < docs; d++) cu.push_back(int32_t(d + 1 == docs ? seq : cu.back() + len));
  for (int64_t t = 0; t < seq; t++) labels[size_t(t)] = ids[size_t(t)] = next_id();
  for (int64_t d = 0; d < docs; d++) {
    labels[size_t(cu[size_t(d)])] = -100;
    for (int64_t t = cu[size_t(d)]; t < cu[size_t(d) + 1]; t++) pos[size_t(t)] = t - cu[size_t(d)];
  }
  return model::batch_from_labels(
      Tensor::from_vector(ids, {seq}), Tensor::from_vector(labels, {seq}),
      Tensor::from_vector(pos, {seq}), Tensor::from_vector(cu, {docs + 1}));
}

// The step the benchmarks time: `dtype` parameters, AdamW (betas 0.9/0.999, eps 1e-8, weight
// decay 0.01 on projection weights) at `lr` constant from the first of `total_steps` steps,
// global gradient-norm clipping to 1.0, no activation checkpointing.
inline train::TrainConfig step_config(DType dtype, int64_t total_steps, double lr) {
  train::TrainConfig c;
  auto& t = c.training;
  t.param_dtype = dtype;
  t.total_steps = total_steps;
  t.warmup_steps = 0;
  t.scheduler_type = optim::ScheduleType::constant;
  t.lr_llm = lr;
  t.weight_decay = 0.01;
  t.adam_beta1 = 0.9;
  t.adam_beta2 = 0.999;
  t.adam_eps = 1e-8;
  t.max_grad_norm = 1.0;
  t.ac_mode = train::AcMode::off;
  return c;
}

// What the timed loop of steps measured.
struct StepTimes {
  std::vector<double> ms;                                    // of each timed step
  double loss_first = 0, grad_norm_first = 0, loss_last = 0; // first warm-up, last timed step
};

// `warmup` + `steps` optimizer steps of `stepper` on `batch`, the last `steps` timed (steady_clock)
// from a `wait` before the step to one after it (a device's queued work; nothing on the CPU). A
// skipped step is an error of `program`.
inline StepTimes time_steps(
    train::TrainStepper& stepper, const std::vector<model::Batch>& batch, int64_t warmup,
    int64_t steps, const std::string& program, const std::function<void()>& wait = [] {}) {
  StepTimes r;
  for (int64_t s = 0; s < warmup + steps; s++) {
    wait();
    const auto a = std::chrono::steady_clock::now();
    const train::StepStats st = stepper.step(s, batch);
    wait();
    const auto b = std::chrono::steady_clock::now();
    VLM_CHECK(!st.skipped, program, ": step ", s + 1, " was skipped");
    if (s == 0) r.loss_first = st.loss, r.grad_norm_first = st.grad_norm;
    r.loss_last = st.loss;
    if (s >= warmup) r.ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  return r;
}

// The figures that close the CPU step benchmarks' JSON line (`tokens` per step): tokens_per_s and
// step_ms at the median step, step_ms_min, threads (omp_get_max_threads), loss_first, loss_last.
inline void add_step_figures(nlohmann::ordered_json& j, const StepTimes& t, int64_t tokens) {
  const double step_ms = median(t.ms);
  j["tokens_per_s"] = double(tokens) / (step_ms / 1e3);
  j["step_ms"] = step_ms;
  j["step_ms_min"] = *std::min_element(t.ms.begin(), t.ms.end());
  j["threads"] = omp_get_max_threads();
  j["loss_first"] = t.loss_first;
  j["loss_last"] = t.loss_last;
}

// The common records of a step benchmark (bench/record.h), before its JSON line: the median
// step_ms, the fastest step's, and tokens_per_s at the median.
inline void emit_step_records(const std::string& benchmark, const std::string& case_name,
                              const std::string& device, const StepTimes& t, int64_t tokens) {
  const double step_ms = median(t.ms);
  emit(benchmark, case_name, "1", device, "step_ms", step_ms);
  emit(benchmark, case_name, "1", device, "step_ms_min",
       *std::min_element(t.ms.begin(), t.ms.end()));
  emit(benchmark, case_name, "1", device, "tokens_per_s", double(tokens) / (step_ms / 1e3));
}

} // namespace vlm::bench
