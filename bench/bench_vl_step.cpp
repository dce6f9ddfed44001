// One Qwen3-VL training step on CPU (forward + backward + clip + AdamW, vision tower included):
// tokens/s of the TrainStepper on an HF snapshot and a batch file (the format of `vlmtrain
// dump`: input_ids, labels, position_ids [3, T], cu_seqlens, pixel_values, image_grid_thw).
// bench/bench_vl_step.sh writes both with transformers and runs PyTorch eager on the same ones.
//
// Usage: bench_vl_step --model DIR --batch FILE [--steps K (10)] [--warmup W (2)]
// The step: fp32, every part trained, AdamW (lr 1e-3 constant for all groups, betas 0.9/0.999,
// eps 1e-8, weight decay 0.01 on projection weights), clipping to 1.0, no activation
// checkpointing. Prints one JSON line: tokens_per_s (median over K timed steps), step_ms,
// step_ms_min, threads, loss_first, loss_last.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/batch_file.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/train/config.h"
#include "src/train/train_step.h"

using namespace vlm;

int main(int argc, char** argv) {
  try {
    std::string model_dir, batch_path;
    int64_t steps = 10, warmup = 2;
    for (int i = 1; i < argc; i++) {
      const std::string a = argv[i];
      VLM_CHECK(i + 1 < argc, "bench_vl_step: option ", a, " needs a value");
      const std::string v = argv[++i];
      if (a == "--model")
        model_dir = v;
      else if (a == "--batch")
        batch_path = v;
      else if (a == "--steps")
        steps = std::atoll(v.c_str());
      else if (a == "--warmup")
        warmup = std::atoll(v.c_str());
      else
        VLM_FAIL("bench_vl_step: unknown option ", a, " (valid: --model --batch --steps --warmup)");
    }
    VLM_CHECK(!model_dir.empty() && !batch_path.empty() && steps >= 1 && warmup >= 0,
              "bench_vl_step: need --model DIR --batch FILE, --steps >= 1, --warmup >= 0");
    auto m = model::load_pretrained(model_dir, DType::f32);
    train::TrainConfig c;
    auto& t = c.training;
    t.param_dtype = DType::f32;
    t.total_steps = warmup + steps;
    t.warmup_steps = 0;
    t.scheduler_type = optim::ScheduleType::constant;
    t.lr_llm = t.lr_mlp = t.lr_vit = 1e-3;
    t.weight_decay = 0.01;
    t.adam_beta1 = 0.9;
    t.adam_beta2 = 0.999;
    t.adam_eps = 1e-8;
    t.max_grad_norm = 1.0;
    c.model.train_llm = c.model.train_mlp = c.model.train_vit = true;
    train::TrainStepper stepper(c, m);

    model::Batch b = model::read_batch_file(batch_path, m->has_vision());
    model::validate_batch(b, m->vocab_size());
    const std::vector<model::Batch> batch{b};
    double loss_first = 0, loss_last = 0;
    std::vector<double> ms;
    for (int64_t s = 0; s < warmup + steps; s++) {
      const auto t0 = std::chrono::steady_clock::now();
      const train::StepStats st = stepper.step(s, batch);
      const auto t1 = std::chrono::steady_clock::now();
      VLM_CHECK(!st.skipped, "bench_vl_step: step ", s + 1, " was skipped");
      if (s == 0) loss_first = st.loss;
      loss_last = st.loss;
      if (s >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    const double med = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    nlohmann::ordered_json j;
    j["impl"] = "vlmtrain";
    j["params"] = m->num_parameters();
    j["tokens"] = b.input_ids.numel();
    j["tokens_per_s"] = double(b.input_ids.numel()) / (med / 1e3);
    j["step_ms"] = med;
    j["step_ms_min"] = ms.front();
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
