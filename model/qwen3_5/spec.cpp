#include "model/qwen3_5/spec.h"

#include "model/qwen3_5/model.h"
#include "model/vision/vision_tp_plan.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

// The released dense sizes (qwen-models.md §3.1; 2B partly unconfirmed there), for random-init
// benchmarks and scaling runs. Every size: head_dim 256, 16 key heads of 128 in the Gated
// DeltaNet layers, every 4th layer full attention.
struct Size {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, ffn, value_heads;
  bool tied;
  int64_t depth, vision_hidden, vision_ffn, vision_heads;
};
constexpr Size kSizes[] = {
    {"qwen3.5-0.8b", 1024, 24, 8, 2, 3584, 16, true, 12, 768, 3072, 12},
    {"qwen3.5-2b", 2048, 24, 8, 2, 6144, 16, true, 24, 1024, 4096, 16},
    {"qwen3.5-4b", 2560, 32, 16, 4, 9216, 32, true, 24, 1024, 4096, 16},
    {"qwen3.5-9b", 4096, 32, 16, 4, 12288, 32, false, 27, 1152, 4304, 16},
    {"qwen3.5-27b", 5120, 64, 24, 4, 17408, 48, false, 27, 1152, 4304, 16},
};

Qwen3_5Config released(const Size& s) {
  Qwen3_5Config c;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.ffn;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.mrope_section = {11, 11, 10};
  c.tie_word_embeddings = s.tied;
  for (int64_t i = 0; i < s.layers; i++)
    c.layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  c.linear_num_value_heads = s.value_heads;
  c.vision.depth = s.depth;
  c.vision.hidden_size = s.vision_hidden;
  c.vision.intermediate_size = s.vision_ffn;
  c.vision.num_heads = s.vision_heads;
  c.vision.out_hidden_size = s.hidden;
  c.vision.num_position_embeddings = 2304;
  c.torch_dtype = "bfloat16";
  return c;
}

// The demo's size (configs/demo-qwen3.5.toml): the T3 stack of the golden tests with T2's widths
// (I = 128; vision depth 4, width 64, 4 heads, Iv 128), as the tiny Qwen3-VL of the main job.
Qwen3_5Config demo_size() {
  Qwen3_5Config c = tiny_qwen3_5_config();
  c.intermediate_size = 128;
  c.set_tiny_vision();
  c.vision.deepstack_visual_indexes.clear();
  return c;
}

nlohmann::json adapted(Qwen3_5Config c, const PresetOptions& o) {
  adapt_to_tokenizer(c.vocab_size, c, o);
  return c.to_json();
}

} // namespace

ModelSpec qwen3_5_model_spec() {
  ModelSpec s;
  s.model_type = "qwen3_5";
  s.description = "Qwen3.5 dense hybrid Gated DeltaNet vision-language model "
                  "(Qwen3_5ForConditionalGeneration)";
  s.tp_plan = vision_language_tp_plan;
  s.build = [](const nlohmann::json& config, const std::string& where, DType dtype) {
    return std::make_shared<Qwen3_5ForConditionalGeneration>(
        Qwen3_5Config::from_json(config, where), dtype);
  };
  s.presets["tiny-3.5"] = [](const PresetOptions& o) { return adapted(demo_size(), o); };
  for (const Size& size : kSizes)
    s.presets[size.name] = [size](const PresetOptions& o) { return adapted(released(size), o); };
  return s;
}

ModelSpec qwen3_5_moe_model_spec() {
  return refused_model_spec(
      "qwen3_5_moe", "Qwen3.5 mixture of experts, 35B-A3B, 122B-A10B and 397B-A17B",
      "vlmtrain has no MoE layers yet; the dense Qwen3.5 models (\"qwen3_5\") are");
}

} // namespace vlm::model
