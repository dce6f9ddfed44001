#include "bench/bench_step_setup.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "bench/record.h"
#include "io/text/tokenizer.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/base/rng.h"
#include "src/train/model_setup.h"

namespace vlm::bench {

void add_model_size_options(CLI::App& app, ModelSize& s) {
  app.add_option("--hidden", s.hidden, "hidden size")->check(cli::at_least(1));
  app.add_option("--layers", s.layers, "decoder layers")->check(cli::at_least(1));
  app.add_option("--heads", s.heads, "query heads")->check(cli::at_least(1));
  app.add_option("--kv-heads", s.kv_heads, "key/value heads")->check(cli::at_least(1));
  app.add_option("--head-dim", s.head_dim, "head dimension")->check(cli::at_least(1));
  app.add_option("--ffn", s.ffn, "MLP intermediate size")->check(cli::at_least(1));
  app.add_option("--vocab", s.vocab, "vocabulary size")->check(cli::at_least(1));
}

nlohmann::json sized_qwen3_config(const ModelSize& s, int64_t seq) {
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

void add_config_options(CLI::App& app, ConfigOption& c, const std::string& settings,
                        const std::vector<std::string>& replaced) {
  CLI::Option* config = app.add_option(
      "--config", c.path,
      "a training config (vlmtrain train --config): its model (random weights) and " + settings);
  for (const std::string& f : replaced) app.get_option(f)->excludes(config); // --help shows them
  app.add_option("--set", c.sets, "section.key=value on --config, as vlmtrain train --set")
      ->needs(config);
}

ConfigStep load_config_step(const ConfigOption& c, int64_t steps) {
  ConfigStep s;
  s.config = train::load_train_config(c.path, c.sets);
  s.config.training.total_steps = std::max(s.config.training.total_steps, steps);
  const io::Tokenizer tok = io::Tokenizer::from_file(s.config.model.tokenizer);
  const std::shared_ptr<model::CausalLM> m = train::describe_model(s.config, tok);
  s.hf_config = m->hf_config();
  s.vocab = m->vocab_size();
  for (const auto& [key, value] : s.hf_config.items())
    if (key.ends_with("_token_id") && value.is_number_integer())
      s.special_ids.push_back(value.get<int64_t>());
  s.name = c.path + " (" + s.hf_config.value("model_type", "?") + ")";
  return s;
}

const nlohmann::json& text_config(const nlohmann::json& hf_config) {
  return hf_config.contains("text_config") ? hf_config["text_config"] : hf_config;
}

ParallelModel random_parallel_model(const nlohmann::json& hf_config, DType dtype,
                                    const std::string& program,
                                    const parallel::ParallelGroups& groups,
                                    parallel::ParallelizeOptions options, Device device) {
  ParallelModel r;
  r.model = model::build_model(hf_config, program, dtype); // described: nothing allocated
  if (groups.tp && groups.tp->size() > 1) options.tp_plan = model::tp_plan(*r.model);
  r.parallelized = parallel::parallelize(*r.model, r.model->blocks(), groups, options, device);
  Rng rng(0);
  r.model->initialize(rng, parallel::init_parts(r.parallelized.param_layouts()));
  return r;
}

std::function<int64_t()> avoiding(std::vector<int64_t> special, std::function<int64_t()> next) {
  return [special = std::move(special), next = std::move(next)] {
    int64_t id = next();
    while (std::count(special.begin(), special.end(), id)) id = next();
    return id;
  };
}

model::Batch packed_batch(int64_t seq, int64_t docs, const std::function<int64_t()>& next_id) {
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

train::TrainConfig step_config(DType dtype, int64_t total_steps, double lr) {
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

StepTimes time_steps(train::TrainStepper& stepper, const std::vector<model::Batch>& batch,
                     const Timing& t, const Timer& timer, const std::string& program) {
  StepTimes r;
  int64_t s = 0;
  for (const double seconds : timer.runs(t, [&] {
         const train::StepStats st = stepper.step(s, batch);
         VLM_CHECK(!st.skipped, program, ": step ", s + 1, " was skipped (loss ", st.loss,
                   ", gradient norm ", st.grad_norm,
                   "): a non-finite step is not timed; lower the learning rate or use f32");
         if (s == 0) r.loss_first = st.loss, r.grad_norm_first = st.grad_norm;
         r.loss_last = st.loss;
         s++;
       }))
    r.ms.push_back(seconds * 1e3);
  return r;
}

void add_step_figures(nlohmann::ordered_json& j, const StepTimes& t, int64_t tokens) {
  const double step_ms = median(t.ms);
  j["tokens_per_s"] = double(tokens) / (step_ms / 1e3);
  j["step_ms"] = step_ms;
  j["step_ms_min"] = *std::min_element(t.ms.begin(), t.ms.end());
  j["threads"] = omp_get_max_threads();
  j["loss_first"] = t.loss_first;
  j["loss_last"] = t.loss_last;
}

void emit_step_records(const std::string& benchmark, const std::string& case_name,
                       const std::string& device, const StepTimes& t, int64_t tokens) {
  const double step_ms = median(t.ms);
  emit(benchmark, case_name, "1", device, "step_ms", step_ms);
  emit(benchmark, case_name, "1", device, "step_ms_min",
       *std::min_element(t.ms.begin(), t.ms.end()));
  emit(benchmark, case_name, "1", device, "tokens_per_s", double(tokens) / (step_ms / 1e3));
}

} // namespace vlm::bench
