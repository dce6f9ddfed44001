// One Qwen3 training step on a GPU (forward + backward + clip + AdamW): tokens/s, TFLOP/s and MFU
// of the TrainStepper (src/train/train_step.h) on a fixed batch. bench/bench_gpu_step.sh runs it
// next to a PyTorch eager run of the same model and batch (bench/bench_gpu_step.py) and prints
// both side by side. Builds in every configuration: `--preset tiny --device cpu` is the smoke
// check of the same code path on a machine without a GPU.
//
// Usage: bench_gpu_step [--preset 1.7b|tiny (1.7b)] [--layers L (preset)] [--seq-len S (4096;
//          tiny 64)] [--rows R (2)] [--steps K (10)] [--warmup W (3)] [--ac off|selective|full
//          (off)] [--loss-vocab-chunk N (0)] [--lr LR (3e-4)] [--device cpu|cuda[:N] (cuda)]
//        bench_gpu_step [--preset ...] [--layers L] --write-config FILE
//   The second form writes the model's HF config.json (what the PyTorch side loads) and exits.
//
// The model: Qwen3-1.7B (qwen-models.md §1.1: H 2048, L 28, Hq 16, Hkv 8, D 128, I 6144, vocab
// 151936, tied head) or T1 (§8, tied), random HF init on the CPU in bf16, then moved to the device.
// The batch: R rows of S tokens, one document per row (cu_seqlens 0, S, 2S, ...; the PyTorch side
// runs [R, S] with plain causal SDPA, which is the same attention), token ids of all R·S positions
// from the LCG of bench_train_step.cpp (x = x·6364136223846793005 + 1442695040888963407 mod 2^64,
// seed 1, id = (x >> 33) % vocab), positions restarting per row, targets the next id within the
// row (R·(S − 1) targets). The step: bf16 parameters and activations with fp32 master weights and
// AdamW states (betas 0.9/0.999, eps 1e-8, constant LR, weight decay 0.01 on projection weights
// only), global gradient-norm clipping to 1.0, one micro-batch of all R rows.
//
// Timing: each step between two device synchronizations (steady_clock), median of K steps after W
// warm-ups. FLOPs per step: model/flops.h (6 · matmul weights · tokens + causal attention; tied
// head counted). MFU against the device's dense bf16 peak (device_peak_tflops; none on the CPU).
//
// Prints one JSON line: {"impl": "vlmtrain", "device", "config": {...}, "seq_len", "rows",
// "tokens_per_step", "targets_per_step", "ids_checksum" (Σ id[t]·(t mod 1000003 + 1) over the
// batch, which the PyTorch side reports too), "ac", "loss_vocab_chunk", "lr", "steps", "warmup",
// "step_ms" (median), "step_ms_min", "step_ms_max", "tokens_per_s", "flops_per_step",
// "flops_per_token", "tflops" (at the median step), "peak_tflops", "mfu" (null without a peak),
// "peak_memory_bytes" (peak bytes of tensors on the device), "init_s" (init + move to the device),
// "loss_first", "loss_last" (first warm-up step, last timed step), "grad_norm_first"}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#if VLM_WITH_CUDA
#include "kernels/gpu_runtime.h"
#endif
#include "model/model_spec.h"
#include "parallel/activation_checkpointing.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/core/allocator.h"
#include "src/core/device.h"
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
  int64_t rows = 2;
  int64_t steps = 10, warmup = 3;
  std::string ac = "off";
  int64_t loss_vocab_chunk = 0;
  double lr = 3e-4;
  std::string device = "cuda";
  std::string write_config; // non-empty: write config.json there and exit
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    VLM_CHECK(i + 1 < argc, "bench_gpu_step: option ", a, " needs a value");
    const std::string v = argv[++i];
    auto num = [&] {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      VLM_CHECK(end && *end == '\0' && !v.empty(), "bench_gpu_step: ", a,
                " needs an integer, got '", v, "'");
      return int64_t(n);
    };
    if (a == "--preset")
      o.preset = v;
    else if (a == "--layers")
      o.layers = num();
    else if (a == "--seq-len")
      o.seq_len = num();
    else if (a == "--rows")
      o.rows = num();
    else if (a == "--steps")
      o.steps = num();
    else if (a == "--warmup")
      o.warmup = num();
    else if (a == "--ac")
      o.ac = v;
    else if (a == "--loss-vocab-chunk")
      o.loss_vocab_chunk = num();
    else if (a == "--lr") {
      char* end = nullptr;
      o.lr = std::strtod(v.c_str(), &end);
      VLM_CHECK(end && *end == '\0' && !v.empty(), "bench_gpu_step: --lr needs a number, got '", v,
                "'");
    } else if (a == "--device")
      o.device = v;
    else if (a == "--write-config")
      o.write_config = v;
    else
      VLM_FAIL("bench_gpu_step: unknown option ", a,
               " (valid: --preset --layers --seq-len --rows --steps --warmup --ac "
               "--loss-vocab-chunk --lr --device --write-config)");
  }
  VLM_CHECK(o.preset == "1.7b" || o.preset == "tiny",
            "bench_gpu_step: --preset must be 1.7b or tiny, got '", o.preset, "'");
  if (o.seq_len == 0) o.seq_len = o.preset == "tiny" ? 64 : 4096;
  VLM_CHECK(o.seq_len >= 2 && o.rows >= 1, "bench_gpu_step: need --seq-len >= 2 and --rows >= 1");
  VLM_CHECK(o.layers >= 0, "bench_gpu_step: --layers must be >= 0 (0 = the preset's)");
  VLM_CHECK(o.steps >= 1 && o.warmup >= 0, "bench_gpu_step: need --steps >= 1 and --warmup >= 0");
  VLM_CHECK(o.loss_vocab_chunk >= 0, "bench_gpu_step: --loss-vocab-chunk must be >= 0");
  VLM_CHECK(o.lr > 0, "bench_gpu_step: --lr must be > 0");
  VLM_CHECK(o.ac == "off" || o.ac == "selective" || o.ac == "full",
            "bench_gpu_step: --ac must be off, selective or full, got '", o.ac, "'");
  return o;
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

struct Batch {
  model::Batch text; // on the CPU
  std::vector<int32_t> cu_seqlens;
  int64_t ids_checksum = 0;
};

// The batch of the header comment.
Batch make_batch(const Options& o, int64_t vocab) {
  const int64_t T = o.rows * o.seq_len;
  const auto n = static_cast<size_t>(T);
  std::vector<int64_t> ids(n), labels(n), pos(n);
  Batch b;
  uint64_t x = 1;
  for (int64_t t = 0; t < T; t++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids[size_t(t)] = int64_t((x >> 33) % uint64_t(vocab));
    b.ids_checksum += ids[size_t(t)] * (t % 1000003 + 1);
    // HF-aligned labels: -100 on each row's first token, so no target crosses a row.
    labels[size_t(t)] = t % o.seq_len == 0 ? -100 : ids[size_t(t)];
    pos[size_t(t)] = t % o.seq_len;
  }
  for (int64_t r = 0; r <= o.rows; r++) b.cu_seqlens.push_back(int32_t(r * o.seq_len));
  b.text = model::batch_from_labels(Tensor::from_vector(ids, {T}), Tensor::from_vector(labels, {T}),
                                    Tensor::from_vector(pos, {T}),
                                    Tensor::from_vector(b.cu_seqlens, {o.rows + 1}));
  return b;
}

// Waits for the device's queued work (the step returns before its last kernels finish).
void synchronize(Device device) {
#if VLM_WITH_CUDA
  if (device.is_cuda()) kernels::cuda::device_synchronize();
#endif
  (void)device;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

} // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const nlohmann::json config = model_config(o);
    std::shared_ptr<model::CausalLM> m = model::build_model(config, "bench_gpu_step", DType::bf16);
    if (!o.write_config.empty()) {
      std::ofstream f(o.write_config);
      VLM_CHECK(f.good(), "bench_gpu_step: cannot write ", o.write_config);
      f << m->hf_config().dump(2) << "\n";
      VLM_CHECK(f.good(), "bench_gpu_step: cannot write ", o.write_config);
      return 0;
    }
    const Device device = parse_device(o.device);
    VLM_CHECK(device.is_cpu() || device.index < cuda_device_count(), "bench_gpu_step: --device ",
              o.device, " is not available: ", cuda_device_query());

    const auto init_start = Clock::now();
    Rng rng(0);
    m->init_weights(rng); // on the CPU, as the trainer does
    m->to(device);
    synchronize(device);
    const double init_s = seconds_since(init_start);

    train::TrainConfig c;
    auto& t = c.training;
    t.device = o.device;
    t.param_dtype = DType::bf16;
    t.total_steps = o.warmup + o.steps;
    t.warmup_steps = 0;
    t.scheduler_type = optim::ScheduleType::constant;
    t.lr_llm = o.lr;
    t.weight_decay = 0.01;
    t.adam_beta1 = 0.9;
    t.adam_beta2 = 0.999;
    t.adam_eps = 1e-8;
    t.max_grad_norm = 1.0;
    t.micro_batch_rows = o.rows;
    c.data.seq_len = o.seq_len;
    t.ac_mode = parallel::parse_ac_mode(o.ac);
    parallel::apply_activation_checkpointing(m->blocks(), t.ac_mode);
    t.loss_vocab_chunk = o.loss_vocab_chunk;
    train::TrainStepper stepper(c, m);

    const Batch host = make_batch(o, m->vocab_size());
    const std::vector<model::Batch> batch{model::to_device(host.text, device)};
    const model::TrainingFlops flops = m->training_flops(host.cu_seqlens);

    double loss_first = 0, loss_last = 0, grad_norm_first = 0;
    std::vector<double> ms;
    for (int64_t s = 0; s < o.warmup + o.steps; s++) {
      synchronize(device);
      const auto a = Clock::now();
      const train::StepStats st = stepper.step(s, batch);
      synchronize(device);
      const double step_s = seconds_since(a);
      VLM_CHECK(!st.skipped, "bench_gpu_step: step ", s + 1, " was skipped");
      if (s == 0) {
        loss_first = st.loss;
        grad_norm_first = st.grad_norm;
      }
      loss_last = st.loss;
      if (s >= o.warmup) ms.push_back(step_s * 1e3);
    }

    const double step_ms = median(ms);
    const double tflops = flops.total() / (step_ms / 1e3) / 1e12;
    const double peak = device_peak_tflops(device);
    nlohmann::ordered_json j;
    j["impl"] = "vlmtrain";
    j["device"] = device.str();
    j["config"] = {{"preset", o.preset},
                   {"hidden", config["hidden_size"]},
                   {"layers", config["num_hidden_layers"]},
                   {"heads", config["num_attention_heads"]},
                   {"kv_heads", config["num_key_value_heads"]},
                   {"head_dim", config["head_dim"]},
                   {"ffn", config["intermediate_size"]},
                   {"vocab", m->vocab_size()},
                   {"tied", config["tie_word_embeddings"]},
                   {"params", m->num_parameters()}};
    j["seq_len"] = o.seq_len;
    j["rows"] = o.rows;
    j["tokens_per_step"] = flops.tokens;
    j["targets_per_step"] = model::count_targets(batch[0]);
    j["ids_checksum"] = host.ids_checksum;
    j["ac"] = o.ac;
    j["loss_vocab_chunk"] = o.loss_vocab_chunk;
    j["lr"] = o.lr;
    j["steps"] = o.steps;
    j["warmup"] = o.warmup;
    j["step_ms"] = step_ms;
    j["step_ms_min"] = *std::min_element(ms.begin(), ms.end());
    j["step_ms_max"] = *std::max_element(ms.begin(), ms.end());
    j["tokens_per_s"] = double(flops.tokens) / (step_ms / 1e3);
    j["flops_per_step"] = flops.total();
    j["flops_per_token"] = flops.per_token();
    j["tflops"] = tflops;
    j["peak_tflops"] = peak;
    j["mfu"] = peak > 0 ? nlohmann::ordered_json(tflops / peak) : nlohmann::ordered_json();
    j["peak_memory_bytes"] = allocator_for(device).stats().peak_bytes;
    j["init_s"] = init_s;
    j["loss_first"] = loss_first;
    j["loss_last"] = loss_last;
    j["grad_norm_first"] = grad_norm_first;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
