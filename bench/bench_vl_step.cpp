// One vision-language training step on CPU (forward + backward + clip + AdamW, vision tower
// included): tokens/s of the TrainStepper on an HF snapshot of any family (Qwen3-VL, Qwen3.5) and a
// batch file (the format of `vlmtrain dump`: input_ids, labels, position_ids [3, T], cu_seqlens,
// pixel_values, image_grid_thw). bench/bench_vl_step.sh writes both with transformers
// (bench/bench_vl_step_ref.py) and runs PyTorch eager on the same ones.
//
// Usage: bench_vl_step --model DIR --batch FILE [--steps K] [--warmup W]   (--help: defaults)
// The step: fp32, every part trained, AdamW (lr 1e-3 constant for all groups, betas 0.9/0.999,
// eps 1e-8, weight decay 0.01 on projection weights), clipping to 1.0, no activation
// checkpointing; timing: bench/timing.h. Prints the common records and one JSON line: tokens_per_s
// (median over K timed steps), step_ms, step_ms_min, threads, loss_first, loss_last.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_step_setup.h"
#include "bench/record.h"
#include "model/batch_file.h"
#include "model/model_spec.h"
#include "src/train/train_step.h"

using namespace vlm;

namespace {

struct Options {
  std::string model_dir, batch_path;
  bench::Timing timing{2, 10};
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  app.add_option("--model", o.model_dir, "the HF snapshot folder")->required();
  app.add_option("--batch", o.batch_path, "the batch file (safetensors, as `vlmtrain dump`)")
      ->required();
  bench::add_timing_options(app, o.timing, "--steps", "steps");
}

int run(const Options& o) {
  auto m = model::load_pretrained(o.model_dir, DType::f32);
  train::TrainConfig c = bench::step_config(DType::f32, o.timing.warmup + o.timing.iters, 1e-3);
  c.training.lr_mlp = c.training.lr_vit = 1e-3;
  c.model.train_llm = c.model.train_mlp = c.model.train_vit = true;
  train::TrainStepper stepper(c, m);

  model::Batch b = model::read_batch_file(o.batch_path, m->has_vision());
  model::validate_batch(b, m->vocab_size());
  const std::vector<model::Batch> batch{b};
  const bench::StepTimes times =
      bench::time_steps(stepper, batch, o.timing, bench::Timer(), "bench_vl_step");
  nlohmann::ordered_json j;
  j["impl"] = "vlmtrain";
  j["params"] = m->num_parameters();
  j["tokens"] = b.input_ids.numel();
  bench::add_step_figures(j, times, b.input_ids.numel());
  bench::emit_step_records("bench_vl_step",
                           o.model_dir + ", " + std::to_string(b.input_ids.numel()) + " tokens",
                           "cpu", times, b.input_ids.numel());
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"One CPU training step of a Qwen3-VL or Qwen3.5 snapshot on a batch file: tokens/s.",
               "bench_vl_step"};
  Options o;
  add_options(app, o);
  return bench::run_main(app, argc, argv, [&] { return run(o); });
}
