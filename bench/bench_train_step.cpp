// One training step on CPU (forward + backward + clip + AdamW) of a random-init Qwen3: tokens/s
// of the TrainStepper (src/train/train_step.h) on a fixed packed batch. bench/bench_train_step.sh
// runs it next to a PyTorch eager reference of the same model and batch and prints the ratio.
//
// Usage: bench_train_step [options]   (--help lists them with their defaults: config T1 of
//   qwen-models.md §8, S = --seq tokens in N = --docs documents, K = --steps timed steps after
//   --warmup ones, --dtype f32|bf16; threads: OMP_NUM_THREADS)
//
// The batch: S tokens in N documents of S / N tokens (the last one takes the remainder), token
// ids from a 64-bit LCG (x = x * 6364136223846793005 + 1442695040888963407 mod 2^64, seed 1,
// id = (x >> 33) % V — bench_train_step.sh makes the same ids in Python), position ids restarting
// per document, HF-aligned labels = ids with -100 on each document's first token (so no target
// crosses a document; S - N targets). The step: AdamW (betas 0.9/0.999, eps 1e-8, lr 1e-3
// constant, weight decay 0.01 on projection weights), global grad-norm clipping to 1.0,
// no activation checkpointing (bench/bench_step_setup.h).
//
// Prints one JSON line: {"impl": "vlmtrain", "config": {...}, "tokens_per_s": median over the K
// timed steps, "step_ms": median, "step_ms_min", "threads": omp_get_max_threads(), "loss_first",
// "loss_last"} (losses of the first warm-up and the last timed step).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_step_setup.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/train/train_step.h"

using namespace vlm;

namespace {

struct Options {
  bench::ModelSize size{64, 2, 4, 2, 32, 128, 512};
  int64_t seq = 256, docs = 3, steps = 10, warmup = 2;
  std::string dtype = "f32";
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  bench::add_model_size_options(app, o.size);
  app.add_option("--seq", o.seq, "tokens of the packed row")->check(cli::at_least(2));
  app.add_option("--docs", o.docs, "documents in the row (>= 2 tokens each)")
      ->check(cli::at_least(1));
  app.add_option("--steps", o.steps, "timed steps")->check(cli::at_least(1));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(cli::at_least(0));
  app.add_option("--dtype", o.dtype, "parameter and compute dtype")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

int run(const Options& o) {
  VLM_CHECK(o.seq >= 2 * o.docs, "bench_train_step: need 2 tokens per document, got --seq ", o.seq,
            " --docs ", o.docs);
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  std::shared_ptr<model::CausalLM> m =
      model::build_model(bench::sized_qwen3_config(o.size, o.seq), "bench_train_step", dtype);
  Rng rng(0);
  m->init_weights(rng);
  train::TrainStepper stepper(bench::step_config(dtype, o.warmup + o.steps, 1e-3), m);

  const std::vector<model::Batch> batch{
      bench::packed_batch(o.seq, o.docs, bench::LcgIds{o.size.vocab})};
  const bench::StepTimes times =
      bench::time_steps(stepper, batch, o.warmup, o.steps, "bench_train_step");
  nlohmann::ordered_json j;
  j["impl"] = "vlmtrain";
  j["config"] = {{"hidden", o.size.hidden},
                 {"layers", o.size.layers},
                 {"heads", o.size.heads},
                 {"kv_heads", o.size.kv_heads},
                 {"head_dim", o.size.head_dim},
                 {"ffn", o.size.ffn},
                 {"vocab", o.size.vocab},
                 {"seq", o.seq},
                 {"docs", o.docs},
                 {"dtype", o.dtype},
                 {"params", m->num_parameters()}};
  j["steps"] = o.steps;
  j["warmup"] = o.warmup;
  bench::add_step_figures(j, times, o.seq);
  bench::emit_step_records("bench_train_step",
                           "qwen3 hidden " + std::to_string(o.size.hidden) + " x " +
                               std::to_string(o.size.layers) + " layers, seq " +
                               std::to_string(o.seq) + ", " + o.dtype,
                           "cpu", times, o.seq);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"One CPU training step of a random-init Qwen3 on a packed batch: tokens/s.",
               "bench_train_step"};
  Options o;
  add_options(app, o);
  return bench::run_main(app, argc, argv, [&] { return run(o); });
}
