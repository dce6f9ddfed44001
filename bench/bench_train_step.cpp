// One training step on CPU (forward + backward + clip + AdamW) of a random-init model: tokens/s
// of the TrainStepper (src/train/train_step.h) on a fixed packed batch. bench/bench_train_step.sh
// runs it next to a PyTorch eager reference of the same model and batch and prints the ratio.
//
// Usage: bench_train_step [options]   (--help lists them with their defaults: config T1 of
//   qwen-models.md §8, S = --seq tokens in N = --docs documents, K = --steps timed steps after
//   --warmup ones, --dtype f32|bf16; threads: OMP_NUM_THREADS)
//        bench_train_step --config CONFIG.toml [--set section.key=value ...] [--docs N] ...
//   the step of a training config instead, through the trainer's code (bench_step_setup.h): its
//   model (any family, random weights), data.seq_len, param_dtype, ac_mode, optimizer and
//   schedule, made ready by parallel::parallelize as on one rank of `vlmtrain train`; the ids
//   from the same LCG with the model's special tokens redrawn. No PyTorch side.
//
// The batch: S tokens in N documents of S / N tokens (the last one takes the remainder), token
// ids from a 64-bit LCG (x = x * 6364136223846793005 + 1442695040888963407 mod 2^64, seed 1,
// id = (x >> 33) % V — bench_train_step.sh makes the same ids in Python), position ids restarting
// per document, HF-aligned labels = ids with -100 on each document's first token (so no target
// crosses a document; S - N targets). The step: AdamW (betas 0.9/0.999, eps 1e-8, lr 1e-3
// constant, weight decay 0.01 on projection weights), global grad-norm clipping to 1.0,
// no activation checkpointing (bench/bench_step_setup.h). Timing: bench/timing.h.
//
// Prints the common records and one JSON line: {"impl": "vlmtrain", "config": {...},
// "tokens_per_s": median over the K timed steps, "step_ms": median, "step_ms_min", "threads":
// omp_get_max_threads(), "loss_first", "loss_last"} (losses of the first warm-up and the last
// timed step).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_step_setup.h"
#include "bench/record.h"
#include "parallel/parallelize.h"
#include "src/base/check.h"
#include "src/train/train_step.h"

using namespace vlm;

namespace {

struct Options {
  bench::ModelSize size{64, 2, 4, 2, 32, 128, 512};
  int64_t seq = 256, docs = 3;
  bench::Timing timing{2, 10};
  std::string dtype = "f32";
  bench::ConfigOption config;
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  bench::add_model_size_options(app, o.size);
  app.add_option("--seq", o.seq, "tokens of the packed row")->check(cli::at_least(2));
  app.add_option("--dtype", o.dtype, "parameter and compute dtype")
      ->check(CLI::IsMember({"f32", "bf16"}));
  std::vector<std::string> replaced = bench::kModelSizeFlags;
  replaced.insert(replaced.end(), {"--seq", "--dtype"});
  bench::add_config_options(app, o.config,
                            "its seq_len, param_dtype, ac_mode, optimizer and schedule", replaced);
  app.add_option("--docs", o.docs, "documents in the row (>= 2 tokens each)")
      ->check(cli::at_least(1));
  bench::add_timing_options(app, o.timing, "--steps", "steps");
}

// What is measured: the model's config, the step, and the records' case.
struct Step {
  nlohmann::json hf_config;
  train::TrainConfig config;
  std::vector<int64_t> special_ids;
  std::string case_name;
};

Step step_of(const Options& o) {
  const int64_t total = o.timing.warmup + o.timing.iters;
  if (o.config.path.empty()) {
    const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
    return {bench::sized_qwen3_config(o.size, o.seq),
            bench::step_config(dtype, total, 1e-3),
            {},
            "qwen3 hidden " + std::to_string(o.size.hidden) + " x " +
                std::to_string(o.size.layers) + " layers, seq " + std::to_string(o.seq) + ", " +
                o.dtype};
  }
  bench::ConfigStep c = bench::load_config_step(o.config, total);
  c.config.training.micro_batch_rows = 1;
  return {c.hf_config, c.config, c.special_ids,
          c.name + ", seq " + std::to_string(c.config.data.seq_len) + ", " +
              dtype_name(c.config.training.param_dtype) + ", ac " +
              parallel::ac_mode_name(c.config.training.ac_mode)};
}

int run(Options o) {
  const Step step = step_of(o);
  if (!o.config.path.empty()) o.seq = step.config.data.seq_len;
  VLM_CHECK(o.seq >= 2 * o.docs, "bench_train_step: need 2 tokens per document, got ", o.seq,
            " tokens and --docs ", o.docs);
  const DType dtype = step.config.training.param_dtype;
  // As on one rank of the trainer: no groups, activation checkpointing as the step says.
  const bench::ParallelModel pm =
      bench::random_parallel_model(step.hf_config, dtype, "bench_train_step", {},
                                   {step.config.training.ac_mode, {}}, Device::cpu());
  const std::shared_ptr<model::CausalLM>& m = pm.model;
  train::TrainStepper stepper(step.config, m, pm.parallelized);

  const int64_t vocab = m->vocab_size();
  const std::vector<model::Batch> batch{
      bench::packed_batch(o.seq, o.docs, bench::avoiding(step.special_ids, bench::LcgIds{vocab}))};
  const bench::StepTimes times =
      bench::time_steps(stepper, batch, o.timing, bench::Timer(), "bench_train_step");
  const nlohmann::json& text = bench::text_config(step.hf_config);
  nlohmann::ordered_json j;
  j["impl"] = "vlmtrain";
  j["config"] = {{"hidden", text.value("hidden_size", int64_t(0))},
                 {"layers", text.value("num_hidden_layers", int64_t(0))},
                 {"heads", text.value("num_attention_heads", int64_t(0))},
                 {"kv_heads", text.value("num_key_value_heads", int64_t(0))},
                 {"head_dim", text.value("head_dim", int64_t(0))},
                 {"ffn", text.value("intermediate_size", int64_t(0))},
                 {"vocab", vocab},
                 {"seq", o.seq},
                 {"docs", o.docs},
                 {"dtype", dtype_name(dtype)},
                 {"params", m->num_parameters()}};
  j["steps"] = o.timing.iters;
  j["warmup"] = o.timing.warmup;
  bench::add_step_figures(j, times, o.seq);
  bench::emit_step_records("bench_train_step", step.case_name, "cpu", times, o.seq);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"One CPU training step of a random-init model on a packed batch: tokens/s.",
               "bench_train_step"};
  Options o;
  add_options(app, o);
  return bench::run_main(app, argc, argv, [&] { return run(o); });
}
