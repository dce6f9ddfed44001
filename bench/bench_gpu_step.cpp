// One Qwen3 training step on a GPU (forward + backward + clip + AdamW): tokens/s, TFLOP/s and MFU
// of the TrainStepper (src/train/train_step.h) on a fixed batch. bench/bench_gpu_step.sh runs it
// next to a PyTorch eager run of the same model and batch (bench/bench_gpu_step.py) and prints
// both side by side. Builds in every configuration: `--preset tiny --device cpu` is the smoke
// check of the same code path on a machine without a GPU.
//
// Usage: bench_gpu_step [options]   (--help lists them with their defaults: --preset 1.7b|tiny,
//          --layers L, S = --seq-len (0: 4096, tiny 64), R = --rows, K = --steps timed steps
//          after W = --warmup ones, --ac off|selective|full, --loss-vocab-chunk, --lr, --device)
//        bench_gpu_step [--preset ...] [--layers L] --write-config FILE
//   The second form writes the model's HF config.json (what the PyTorch side loads) and exits.
//        bench_gpu_step --config CONFIG.toml [--set section.key=value ...] [--rows R] ...
//   The step of a training config instead, through the trainer's code (bench_step_setup.h): its
//   model (any family, random weights), data.seq_len, param_dtype, ac_mode, loss_vocab_chunk,
//   optimizer and schedule, on R rows of seq_len tokens on --device (the config's
//   training.device is not used). bench_gpu_step.sh's PyTorch side runs the preset form only.
//
// The model: Qwen3-1.7B (qwen-models.md §1.1: H 2048, L 28, Hq 16, Hkv 8, D 128, I 6144, vocab
// 151936, tied head) or T1 (§8, tied), in bf16 with the HF random init drawn into its place on the
// device as the trainer does (bench_step_setup.h's random_parallel_model).
// The batch: R rows of S tokens, one document per row (cu_seqlens 0, S, 2S, ...; the PyTorch side
// runs [R, S] with plain causal SDPA, which is the same attention), token ids of all R·S positions
// from the LCG of bench/bench_step_setup.h (x = x·6364136223846793005 + 1442695040888963407 mod
// 2^64, seed 1, id = (x >> 33) % vocab), positions restarting per row, targets the next id within
// the row (R·(S − 1) targets). The step: bf16 parameters and activations with fp32 master weights
// and AdamW states (betas 0.9/0.999, eps 1e-8, constant LR, weight decay 0.01 on projection weights
// only), global gradient-norm clipping to 1.0, one micro-batch of all R rows.
//
// Timing (bench/timing.h): each step between two CUDA events on the current stream, the device
// synchronized before the closing one, median of K steps after W warm-ups. FLOPs per step:
// model/flops.h (6 · matmul weights · tokens + causal attention; tied head counted). MFU against
// the device's dense bf16 peak (device_peak_tflops; none on the CPU).
//
// Prints one JSON line: {"impl": "vlmtrain", "device", "config": {...}, "seq_len", "rows",
// "tokens_per_step", "targets_per_step", "ids_checksum" (Σ id[t]·(t mod 1000003 + 1) over the
// batch, which the PyTorch side reports too), "ac", "loss_vocab_chunk", "lr", "steps", "warmup",
// "step_ms" (median), "step_ms_min", "step_ms_max", "tokens_per_s", "flops_per_step",
// "flops_per_token", "tflops" (at the median step), "peak_tflops", "mfu" (null without a peak),
// "peak_memory_bytes" (peak bytes of tensors on the device), "init_s" (describe, allocate on the
// device and initialize), "loss_first", "loss_last" (first warm-up step, last timed step),
// "grad_norm_first"}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_step_setup.h"
#include "bench/record.h"
#include "model/flops.h"
#include "model/model_spec.h"
#include "parallel/parallelize.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/core/allocator.h"
#include "src/core/device.h"
#include "src/core/stream.h"
#include "src/core/tensor.h"
#include "src/train/config.h"
#include "src/train/train_step.h"

using namespace vlm;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string preset = "1.7b";
  int64_t layers = 0;  // 0: the preset's
  int64_t seq_len = 0; // 0: the preset's
  int64_t rows = 1;    // 1 x 4096 tokens: both sides fit an H100's 78 GiB (bench_gpu_step.sh)
  bench::Timing timing{3, 10};
  std::string ac = "off";
  int64_t loss_vocab_chunk = 0;
  double lr = 3e-4;
  std::string device = "cuda";
  std::string write_config; // non-empty: write config.json there and exit
  bench::ConfigOption config;
};

void add_options(CLI::App& app, Options& o) {
  cli::show_defaults(app);
  app.add_option("--preset", o.preset, "the model: Qwen3-1.7B or T1")
      ->check(CLI::IsMember({"1.7b", "tiny"}));
  app.add_option("--layers", o.layers, "decoder layers (0: the preset's)")->check(cli::at_least(0));
  app.add_option("--seq-len", o.seq_len, "tokens per row (0: the preset's, 4096; tiny 64)")
      ->check(cli::at_least(0));
  app.add_option("--ac", o.ac, "activation checkpointing")
      ->check(CLI::IsMember({"off", "selective", "full"}));
  app.add_option("--loss-vocab-chunk", o.loss_vocab_chunk, "vocabulary chunk of the loss (0: all)")
      ->check(cli::at_least(0));
  app.add_option("--lr", o.lr, "the constant learning rate")->check(cli::positive());
  bench::add_config_options(
      app, o.config, "its seq_len, param_dtype, ac_mode, loss_vocab_chunk, optimizer and schedule",
      {"--preset", "--layers", "--seq-len", "--ac", "--loss-vocab-chunk", "--lr"});
  app.add_option("--rows", o.rows, "rows of the batch, one document each")->check(cli::at_least(1));
  bench::add_timing_options(app, o.timing, "--steps", "steps");
  app.add_option("--device", o.device, "cpu or cuda[:N]");
  app.add_option("--write-config", o.write_config,
                 "write the model's HF config.json to this file and exit");
}

// The preset's config.json (registry presets "qwen3-1.7b", or "tiny" with a tied head), with
// --layers and the row length applied.
nlohmann::json model_config(const Options& o) {
  nlohmann::json c = model::preset_config(o.preset == "tiny" ? "tiny" : "qwen3-1.7b");
  if (o.preset == "tiny") c["tie_word_embeddings"] = true;
  if (o.layers > 0) c["num_hidden_layers"] = o.layers;
  c["max_position_embeddings"] = std::max(c["max_position_embeddings"].get<int64_t>(), o.seq_len);
  return c;
}

// The model's HF config.json in `path`.
void write_config(const model::CausalLM& m, const std::string& path) {
  std::ofstream f(path);
  VLM_CHECK(f.good(), "bench_gpu_step: cannot write ", path);
  f << m.hf_config().dump(2) << "\n";
  VLM_CHECK(f.good(), "bench_gpu_step: cannot write ", path);
}

struct Batch {
  model::Batch text; // on the CPU
  std::vector<int32_t> cu_seqlens;
  int64_t ids_checksum = 0;
};

// The batch of the header comment: R rows packed as R documents of S tokens (never one of
// `special` ids).
Batch make_batch(const Options& o, int64_t vocab, const std::vector<int64_t>& special) {
  Batch b;
  const std::function<int64_t()> next = bench::avoiding(special, bench::LcgIds{vocab});
  int64_t t = 0;
  b.text = bench::packed_batch(o.rows * o.seq_len, o.rows, [&] {
    const int64_t id = next();
    b.ids_checksum += id * (t++ % 1000003 + 1);
    return id;
  });
  for (int64_t r = 0; r <= o.rows; r++) b.cu_seqlens.push_back(int32_t(r * o.seq_len));
  return b;
}

double seconds_since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// The step of the header comment: bench_step_setup.h's in bf16 at --lr, on --rows rows of
// --seq-len tokens, with --ac and --loss-vocab-chunk.
train::TrainConfig gpu_step_config(const Options& o) {
  train::TrainConfig c = bench::step_config(DType::bf16, o.timing.warmup + o.timing.iters, o.lr);
  auto& t = c.training;
  t.device = o.device;
  t.micro_batch_rows = o.rows;
  c.data.seq_len = o.seq_len;
  t.ac_mode = parallel::parse_ac_mode(o.ac);
  t.loss_vocab_chunk = o.loss_vocab_chunk;
  return c;
}

// What is measured: the model's config.json, the step, the ids the batch never draws and the
// model's name in the records: the preset's, or --config's (whose seq_len, ac_mode,
// loss_vocab_chunk and lr are copied into the options that the JSON line shows).
struct Step {
  nlohmann::json hf_config;
  train::TrainConfig config;
  std::vector<int64_t> special_ids;
  std::string model_name;
};

Step step_of(Options& o) {
  if (o.config.path.empty()) {
    if (o.seq_len == 0) o.seq_len = o.preset == "tiny" ? 64 : 4096;
    VLM_CHECK(o.seq_len >= 2, "bench_gpu_step: need --seq-len >= 2, got ", o.seq_len);
    return {model_config(o), gpu_step_config(o), {}, o.preset};
  }
  bench::ConfigStep c = bench::load_config_step(o.config, o.timing.warmup + o.timing.iters);
  auto& t = c.config.training;
  o.seq_len = c.config.data.seq_len;
  o.ac = parallel::ac_mode_name(t.ac_mode);
  o.loss_vocab_chunk = t.loss_vocab_chunk;
  o.lr = t.lr_llm;
  t.micro_batch_rows = o.rows;
  t.device = o.device;
  return {c.hf_config, c.config, c.special_ids, c.name};
}

// What the run measured, beside the options.
struct Measured {
  bench::StepTimes times;
  model::TrainingFlops flops;
  int64_t targets = 0, ids_checksum = 0;
  double init_s = 0;
};

// The JSON line of the header comment.
void print_json(const Options& o, const Step& step, const model::CausalLM& m, Device device,
                const Measured& r) {
  const nlohmann::json& config = bench::text_config(step.hf_config);
  const std::vector<double>& ms = r.times.ms;
  const double step_ms = bench::median(ms);
  const double tflops = r.flops.total() / (step_ms / 1e3) / 1e12;
  const double peak = device_peak_tflops(device);
  nlohmann::ordered_json j;
  j["impl"] = "vlmtrain";
  j["device"] = device.str();
  j["config"] = {{"preset", step.model_name},
                 {"hidden", config.value("hidden_size", int64_t(0))},
                 {"layers", config.value("num_hidden_layers", int64_t(0))},
                 {"heads", config.value("num_attention_heads", int64_t(0))},
                 {"kv_heads", config.value("num_key_value_heads", int64_t(0))},
                 {"head_dim", config.value("head_dim", int64_t(0))},
                 {"ffn", config.value("intermediate_size", int64_t(0))},
                 {"vocab", m.vocab_size()},
                 {"tied", step.hf_config.value("tie_word_embeddings",
                                               config.value("tie_word_embeddings", false))},
                 {"params", m.num_parameters()}};
  j["seq_len"] = o.seq_len;
  j["rows"] = o.rows;
  j["tokens_per_step"] = r.flops.tokens;
  j["targets_per_step"] = r.targets;
  j["ids_checksum"] = r.ids_checksum;
  j["ac"] = o.ac;
  j["loss_vocab_chunk"] = o.loss_vocab_chunk;
  j["lr"] = o.lr;
  j["dtype"] = dtype_name(step.config.training.param_dtype);
  j["steps"] = o.timing.iters;
  j["warmup"] = o.timing.warmup;
  j["step_ms"] = step_ms;
  j["step_ms_min"] = *std::min_element(ms.begin(), ms.end());
  j["step_ms_max"] = *std::max_element(ms.begin(), ms.end());
  j["tokens_per_s"] = double(r.flops.tokens) / (step_ms / 1e3);
  j["flops_per_step"] = r.flops.total();
  j["flops_per_token"] = r.flops.per_token();
  j["tflops"] = tflops;
  j["peak_tflops"] = peak;
  j["mfu"] = peak > 0 ? nlohmann::ordered_json(tflops / peak) : nlohmann::ordered_json();
  j["peak_memory_bytes"] = allocator_for(device).stats().peak_bytes;
  j["init_s"] = r.init_s;
  j["loss_first"] = r.times.loss_first;
  j["loss_last"] = r.times.loss_last;
  j["grad_norm_first"] = r.times.grad_norm_first;
  // The common records, before the JSON line (bench_gpu_step.sh reads the last line).
  const std::string case_name = step.model_name + ", " + std::to_string(o.rows) + " x " +
                                std::to_string(o.seq_len) + " tokens, ac " + o.ac;
  bench::emit_step_records("bench_gpu_step", case_name, device.str(), r.times, r.flops.tokens);
  bench::emit("bench_gpu_step", case_name, "1", device.str(), "tflops", tflops);
  if (peak > 0) bench::emit("bench_gpu_step", case_name, "1", device.str(), "mfu", tflops / peak);
  bench::emit("bench_gpu_step", case_name, "1", device.str(), "peak_memory_bytes",
              double(allocator_for(device).stats().peak_bytes));
  std::printf("%s\n", j.dump().c_str());
}

int run(Options o) {
  const Step step = step_of(o);
  const DType dtype = step.config.training.param_dtype;
  if (!o.write_config.empty()) {
    write_config(*model::build_model(step.hf_config, "bench_gpu_step", dtype), o.write_config);
    return 0;
  }
  const Device device = parse_device(o.device);
  VLM_CHECK(device.is_cpu() || device.index < cuda_device_count(), "bench_gpu_step: --device ",
            o.device, " is not available: ", cuda_device_query());

  Measured r;
  const auto init_start = Clock::now();
  // As the trainer: described, made ready for the device (AC), allocated there and initialized.
  const bench::ParallelModel pm = bench::random_parallel_model(
      step.hf_config, dtype, "bench_gpu_step", {}, {step.config.training.ac_mode, {}}, device);
  const std::shared_ptr<model::CausalLM>& m = pm.model;
  synchronize_device(device);
  r.init_s = seconds_since(init_start);

  train::TrainStepper stepper(step.config, m, pm.parallelized);

  const Batch host = make_batch(o, m->vocab_size(), step.special_ids);
  const std::vector<model::Batch> batch{model::to_device(host.text, device)};
  r.flops = m->training_flops(host.cu_seqlens);
  r.targets = model::count_targets(batch[0]);
  r.ids_checksum = host.ids_checksum;
  // The step returns before its last kernels: the device is synchronized inside each timed run.
  r.times =
      bench::time_steps(stepper, batch, o.timing,
                        bench::Timer(device, nullptr, /*whole_device=*/true), "bench_gpu_step");
  print_json(o, step, *m, device, r);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"One training step on a GPU: tokens/s, TFLOP/s and MFU.", "bench_gpu_step"};
  Options o;
  add_options(app, o);
  return bench::run_main(app, argc, argv, [&] { return run(o); });
}
