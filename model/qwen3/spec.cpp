#include "model/qwen3/spec.h"

#include <algorithm>

#include "model/qwen3/model.h"
#include "model/text/text_tp_plan.h"

namespace vlm::model {

namespace {

// The released sizes (qwen-models.md §1.1), for random-init benchmarks and scaling runs.
struct Size {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, ffn;
  bool tied;
};
constexpr Size kSizes[] = {{"qwen3-0.6b", 1024, 28, 16, 8, 3072, true},
                           {"qwen3-1.7b", 2048, 28, 16, 8, 6144, true},
                           {"qwen3-4b", 2560, 36, 32, 8, 9728, true},
                           {"qwen3-8b", 4096, 36, 32, 8, 12288, false}};

Qwen3Config released(const Size& s) {
  Qwen3Config c;
  c.vocab_size = 151936;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.ffn;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = s.tied;
  c.max_position_embeddings = 40960;
  c.torch_dtype = "bfloat16";
  return c;
}

// The preset's vocabulary grown to the tokenizer's, rounded up to a multiple of 64.
nlohmann::json with_vocab(Qwen3Config c, const PresetOptions& o) {
  c.vocab_size = std::max<int64_t>(c.vocab_size, (o.min_vocab_size + 63) / 64 * 64);
  return c.to_json();
}

} // namespace

ModelSpec qwen3_model_spec() {
  ModelSpec s;
  s.model_type = "qwen3";
  s.description = "Qwen3 dense text model (Qwen3ForCausalLM)";
  s.tp_plan = text_tp_plan;
  s.build = [](const nlohmann::json& config, const std::string& where, DType dtype) {
    return std::make_shared<Qwen3ForCausalLM>(Qwen3Config::from_json(config, where), dtype);
  };
  s.presets["tiny"] = [](const PresetOptions& o) { return with_vocab(tiny_qwen3_config(), o); };
  for (const Size& size : kSizes)
    s.presets[size.name] = [size](const PresetOptions& o) { return with_vocab(released(size), o); };
  return s;
}

} // namespace vlm::model
