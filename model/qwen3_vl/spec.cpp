#include "model/qwen3_vl/spec.h"

#include <algorithm>

#include "model/qwen3_vl/model.h"
#include "model/vision/vision_tp_plan.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

// The released dense sizes (qwen-models.md §2.1; 32B: the Qwen3-VL-32B-Instruct config.json, whose
// text stack is Qwen3-32B's), for random-init benchmarks and scaling runs.
struct Size {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, ffn;
  bool tied;
  int64_t depth, vision_hidden, vision_ffn;
  std::vector<int64_t> deepstack;
};

const std::vector<Size>& sizes() {
  static const std::vector<Size> s = {
      {"qwen3-vl-2b", 2048, 28, 16, 8, 6144, true, 24, 1024, 4096, {5, 11, 17}},
      {"qwen3-vl-4b", 2560, 36, 32, 8, 9728, true, 24, 1024, 4096, {5, 11, 17}},
      {"qwen3-vl-8b", 4096, 36, 32, 8, 12288, false, 27, 1152, 4304, {8, 16, 24}},
      {"qwen3-vl-32b", 5120, 64, 64, 8, 25600, false, 27, 1152, 4304, {8, 16, 24}},
  };
  return s;
}

Qwen3VLConfig released(const Size& s) {
  Qwen3VLConfig c;
  c.vocab_size = 151936;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.ffn;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = 128;
  c.rope_theta = 5e6;
  c.mrope_section = {24, 20, 20};
  c.max_position_embeddings = 262144;
  c.tie_word_embeddings = s.tied;
  c.vision.depth = s.depth;
  c.vision.hidden_size = s.vision_hidden;
  c.vision.intermediate_size = s.vision_ffn;
  c.vision.num_heads = 16;
  c.vision.out_hidden_size = s.hidden;
  c.vision.num_position_embeddings = 2304;
  c.vision.deepstack_visual_indexes = s.deepstack;
  c.torch_dtype = "bfloat16";
  return c;
}

nlohmann::json adapted(Qwen3VLConfig c, const PresetOptions& o) {
  adapt_to_tokenizer(c.vocab_size, c, o);
  return c.to_json();
}

} // namespace

ModelSpec qwen3_vl_model_spec() {
  ModelSpec s;
  s.model_type = "qwen3_vl";
  s.description = "Qwen3-VL dense vision-language model (Qwen3VLForConditionalGeneration)";
  s.tp_plan = vision_language_tp_plan;
  s.build = [](const nlohmann::json& config, const std::string& where, DType dtype) {
    return std::make_shared<Qwen3VLForConditionalGeneration>(
        Qwen3VLConfig::from_json(config, where), dtype);
  };
  s.presets["tiny-vl"] = [](const PresetOptions& o) { return adapted(tiny_qwen3_vl_config(), o); };
  for (const Size& size : sizes())
    s.presets[size.name] = [size](const PresetOptions& o) { return adapted(released(size), o); };
  return s;
}

ModelSpec qwen3_vl_moe_model_spec() {
  return refused_model_spec(
      "qwen3_vl_moe", "Qwen3-VL mixture of experts, 30B-A3B and 235B-A22B",
      "vlmtrain has no MoE layers yet; the dense Qwen3-VL models (\"qwen3_vl\") are");
}

} // namespace vlm::model
