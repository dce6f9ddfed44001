// One training step on CPU (forward + backward + clip + AdamW) of a random-init Qwen3: tokens/s
// of the TrainStepper (src/train/train_step.h) on a fixed packed batch. bench/bench_train_step.sh
// runs it next to a PyTorch eager reference of the same model and batch and prints the ratio.
//
// Usage: bench_train_step [--hidden H (64)] [--layers L (2)] [--heads Hq (4)] [--kv-heads Hkv (2)]
//          [--head-dim D (32)] [--ffn I (128)] [--vocab V (512)] [--seq S (256)] [--docs N (3)]
//          [--steps K (10)] [--warmup W (2)] [--dtype f32|bf16 (f32)]
//   (defaults: config T1 of qwen-models.md §8; threads: OMP_NUM_THREADS)
//
// The batch: S tokens in N documents of S / N tokens (the last one takes the remainder), token
// ids from a 64-bit LCG (x = x * 6364136223846793005 + 1442695040888963407 mod 2^64, seed 1,
// id = (x >> 33) % V — bench_train_step.sh makes the same ids in Python), position ids restarting
// per document, HF-aligned labels = ids with -100 on each document's first token (so no target
// crosses a document; S - N targets). The step: AdamW (betas 0.9/0.999, eps 1e-8, lr 1e-3
// constant, weight decay 0.01 on projection weights), global grad-norm clipping to 1.0,
// no activation checkpointing.
//
// Prints one JSON line: {"impl": "vlmtrain", "config": {...}, "tokens_per_s": median over the K
// timed steps, "step_ms": median, "step_ms_min", "threads": omp_get_max_threads(), "loss_first",
// "loss_last"} (losses of the first warm-up and the last timed step).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/core/tensor.h"
#include "src/train/config.h"
#include "src/train/train_step.h"

using namespace vlm;

namespace {

struct Options {
  int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 32, ffn = 128, vocab = 512;
  int64_t seq = 256, docs = 3, steps = 10, warmup = 2;
  std::string dtype = "f32";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    VLM_CHECK(i + 1 < argc, "bench_train_step: option ", a, " needs a value");
    const std::string v = argv[++i];
    auto num = [&] {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      VLM_CHECK(end && *end == '\0' && !v.empty(), "bench_train_step: ", a,
                " needs an integer, got '", v, "'");
      return int64_t(n);
    };
    if (a == "--hidden")
      o.hidden = num();
    else if (a == "--layers")
      o.layers = num();
    else if (a == "--heads")
      o.heads = num();
    else if (a == "--kv-heads")
      o.kv_heads = num();
    else if (a == "--head-dim")
      o.head_dim = num();
    else if (a == "--ffn")
      o.ffn = num();
    else if (a == "--vocab")
      o.vocab = num();
    else if (a == "--seq")
      o.seq = num();
    else if (a == "--docs")
      o.docs = num();
    else if (a == "--steps")
      o.steps = num();
    else if (a == "--warmup")
      o.warmup = num();
    else if (a == "--dtype")
      o.dtype = v;
    else
      VLM_FAIL("bench_train_step: unknown option ", a,
               " (valid: --hidden --layers --heads --kv-heads --head-dim --ffn --vocab --seq "
               "--docs --steps --warmup --dtype)");
  }
  VLM_CHECK(o.dtype == "f32" || o.dtype == "bf16",
            "bench_train_step: --dtype must be f32 or bf16, got '", o.dtype, "'");
  VLM_CHECK(o.docs >= 1 && o.seq >= 2 * o.docs, "bench_train_step: need 1 <= docs and ",
            "2 tokens per document, got --seq ", o.seq, " --docs ", o.docs);
  VLM_CHECK(o.steps >= 1 && o.warmup >= 0, "bench_train_step: need --steps >= 1 and --warmup >= 0");
  return o;
}

// The packed batch of the header comment.
model::Batch make_batch(const Options& o) {
  std::vector<int64_t> ids(size_t(o.seq)), labels(size_t(o.seq)), pos(size_t(o.seq));
  std::vector<int32_t> cu{0};
  const int64_t len = o.seq / o.docs;
  for (int64_t d = 0; d < o.docs; d++)
    cu.push_back(int32_t(d + 1 == o.docs ? o.seq : cu.back() + len));
  uint64_t x = 1;
  for (int64_t t = 0; t < o.seq; t++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids[size_t(t)] = int64_t((x >> 33) % uint64_t(o.vocab));
    labels[size_t(t)] = ids[size_t(t)];
  }
  for (int64_t d = 0; d < o.docs; d++) {
    labels[size_t(cu[size_t(d)])] = -100;
    for (int64_t t = cu[size_t(d)]; t < cu[size_t(d) + 1]; t++) pos[size_t(t)] = t - cu[size_t(d)];
  }
  return model::batch_from_labels(
      Tensor::from_vector(ids, {o.seq}), Tensor::from_vector(labels, {o.seq}),
      Tensor::from_vector(pos, {o.seq}), Tensor::from_vector(cu, {o.docs + 1}));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    // The tiny preset's config.json with the sizes of the command line (untied head).
    nlohmann::json mc = model::preset_config("tiny");
    mc["hidden_size"] = o.hidden;
    mc["num_hidden_layers"] = o.layers;
    mc["num_attention_heads"] = o.heads;
    mc["num_key_value_heads"] = o.kv_heads;
    mc["head_dim"] = o.head_dim;
    mc["intermediate_size"] = o.ffn;
    mc["vocab_size"] = o.vocab;
    mc["max_position_embeddings"] = std::max(mc["max_position_embeddings"].get<int64_t>(), o.seq);
    const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;

    std::shared_ptr<model::CausalLM> m = model::build_model(mc, "bench_train_step", dtype);
    Rng rng(0);
    m->init_weights(rng);

    train::TrainConfig c;
    auto& t = c.training;
    t.param_dtype = dtype;
    t.total_steps = o.warmup + o.steps;
    t.warmup_steps = 0;
    t.scheduler_type = optim::ScheduleType::constant;
    t.lr_llm = 1e-3;
    t.weight_decay = 0.01;
    t.adam_beta1 = 0.9;
    t.adam_beta2 = 0.999;
    t.adam_eps = 1e-8;
    t.max_grad_norm = 1.0;
    t.ac_mode = train::AcMode::off;
    train::TrainStepper stepper(c, m);

    const std::vector<model::Batch> batch{make_batch(o)};
    double loss_first = 0, loss_last = 0;
    std::vector<double> ms;
    for (int64_t s = 0; s < o.warmup + o.steps; s++) {
      const auto a = std::chrono::steady_clock::now();
      const train::StepStats st = stepper.step(s, batch);
      const auto b = std::chrono::steady_clock::now();
      VLM_CHECK(!st.skipped, "bench_train_step: step ", s + 1, " was skipped");
      if (s == 0) loss_first = st.loss;
      loss_last = st.loss;
      if (s >= o.warmup) ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
    }
    const double step_ms = median(ms);
    nlohmann::ordered_json j;
    j["impl"] = "vlmtrain";
    j["config"] = {{"hidden", o.hidden},
                   {"layers", o.layers},
                   {"heads", o.heads},
                   {"kv_heads", o.kv_heads},
                   {"head_dim", o.head_dim},
                   {"ffn", o.ffn},
                   {"vocab", o.vocab},
                   {"seq", o.seq},
                   {"docs", o.docs},
                   {"dtype", o.dtype},
                   {"params", m->num_parameters()}};
    j["steps"] = o.steps;
    j["warmup"] = o.warmup;
    j["tokens_per_s"] = double(o.seq) / (step_ms / 1e3);
    j["step_ms"] = step_ms;
    j["step_ms_min"] = *std::min_element(ms.begin(), ms.end());
    j["threads"] = omp_get_max_threads();
    j["loss_first"] = loss_first;
    j["loss_last"] = loss_last;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
