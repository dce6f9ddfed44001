#include "model/qwen3_vl/config.h"

#include <cmath>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

using nlohmann::json;

// As Qwen3Config's: far above any released model.
constexpr int64_t kMaxDimension = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;

// The text side's RoPE: theta and mrope_section from rope_parameters (transformers 5) or the
// legacy rope_theta + rope_scaling (4.x).
void read_rope(const json& t, const std::string& where, Qwen3VLConfig& c) {
  const char* key = has_key(t, "rope_parameters") ? "rope_parameters" : "rope_scaling";
  c.rope_theta = json_double(t, "rope_theta", where, 500000.0);
  if (!has_key(t, key)) return;
  const json& r = t[key];
  const std::string sub = where + " (" + key + ")";
  const std::string type = rope_type_of(r, key, where);
  VLM_CHECK(type == "default" || type == "mrope", where, ": key '", key, ".rope_type' is '", type,
            "'; Qwen3-VL's text RoPE is the default (interleaved MRoPE) one");
  c.rope_theta = json_double(r, "rope_theta", sub, c.rope_theta);
  const auto sec = json_int_list(r, "mrope_section", sub, {24, 20, 20});
  VLM_CHECK(sec.size() == 3, where, ": key '", key, ".mrope_section' must have 3 entries (t, h, w)",
            ", got ", sec.size());
  c.mrope_section = {sec[0], sec[1], sec[2]};
}

} // namespace

DecoderLayerConfig Qwen3VLConfig::decoder_layer() const {
  return {hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
          head_dim,    rms_norm_eps,      attention_bias,      initializer_range};
}

void Qwen3VLConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    VLM_CHECK(v > 0 && v <= kMaxDimension, "Qwen3VLConfig: text ", name, " must be in [1, ",
              kMaxDimension, "], got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", max_position_embeddings);
  VLM_CHECK(num_hidden_layers <= kMaxLayers,
            "Qwen3VLConfig: num_hidden_layers must be <= ", kMaxLayers, ", got ",
            num_hidden_layers);
  VLM_CHECK(num_attention_heads * head_dim <= kMaxDimension,
            "Qwen3VLConfig: num_attention_heads x head_dim must be <= ", kMaxDimension);
  VLM_CHECK(num_attention_heads % num_key_value_heads == 0, "Qwen3VLConfig: num_attention_heads (",
            num_attention_heads, ") must be a multiple of num_key_value_heads (",
            num_key_value_heads, ")");
  VLM_CHECK(head_dim % 2 == 0, "Qwen3VLConfig: head_dim must be even for RoPE, got ", head_dim);
  VLM_CHECK(mrope_section[0] >= 0 && mrope_section[1] >= 0 && mrope_section[2] >= 0 &&
                mrope_section[0] + mrope_section[1] + mrope_section[2] == head_dim / 2,
            "Qwen3VLConfig: mrope_section [", mrope_section[0], ", ", mrope_section[1], ", ",
            mrope_section[2], "] must be non-negative and sum to head_dim / 2 = ", head_dim / 2);
  VLM_CHECK(rms_norm_eps > 0 && std::isfinite(rms_norm_eps),
            "Qwen3VLConfig: rms_norm_eps must be > 0");
  VLM_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "Qwen3VLConfig: rope_theta must be > 0");
  VLM_CHECK(initializer_range >= 0 && std::isfinite(initializer_range),
            "Qwen3VLConfig: initializer_range must be >= 0");
  vision.validate();
  VLM_CHECK(vision.out_hidden_size == hidden_size, "Qwen3VLConfig: vision_config.out_hidden_size (",
            vision.out_hidden_size, ") must equal the text hidden_size (", hidden_size, ")");
  VLM_CHECK(int64_t(vision.deepstack_visual_indexes.size()) <= num_hidden_layers,
            "Qwen3VLConfig: ", vision.deepstack_visual_indexes.size(),
            " DeepStack features need as many text layers, the model has ", num_hidden_layers);
  for (auto [name, id] : {std::pair{"image_token_id", image_token_id},
                          {"video_token_id", video_token_id},
                          {"vision_start_token_id", vision_start_token_id},
                          {"vision_end_token_id", vision_end_token_id}})
    VLM_CHECK(id >= 0 && id < vocab_size, "Qwen3VLConfig: ", name, " = ", id,
              " is outside the vocabulary [0, ", vocab_size, ")");
  VLM_CHECK(token_ids.is_object(), "Qwen3VLConfig: token_ids must be a JSON object");
}

Qwen3VLConfig Qwen3VLConfig::from_json(const json& j, const std::string& where) {
  VLM_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  const std::string model_type = json_string(j, "model_type", where, "qwen3_vl");
  VLM_CHECK(model_type == "qwen3_vl", where, ": key 'model_type' is '", model_type,
            "'; this loader reads dense Qwen3-VL (\"qwen3_vl\") only");
  VLM_CHECK(has_key(j, "text_config"), where, ": missing required key 'text_config'");
  const json t = json_object(j, "text_config", where);
  const std::string tw = where + " (text_config)";
  const std::string text_type = json_string(t, "model_type", tw, "qwen3_vl_text");
  VLM_CHECK(text_type == "qwen3_vl_text", tw, ": key 'model_type' is '", text_type,
            "'; expected \"qwen3_vl_text\"");

  Qwen3VLConfig c;
  c.vocab_size = json_int(t, "vocab_size", tw, 151936);
  c.hidden_size = json_int(t, "hidden_size", tw);
  c.intermediate_size = json_int(t, "intermediate_size", tw);
  c.num_hidden_layers = json_int(t, "num_hidden_layers", tw);
  c.num_attention_heads = json_int(t, "num_attention_heads", tw);
  c.num_key_value_heads = json_int(t, "num_key_value_heads", tw, c.num_attention_heads);
  c.head_dim = json_int(t, "head_dim", tw, 128);
  c.rms_norm_eps = json_double(t, "rms_norm_eps", tw, 1e-6);
  c.attention_bias = json_bool(t, "attention_bias", tw, false);
  c.initializer_range = json_double(t, "initializer_range", tw, 0.02);
  c.max_position_embeddings = json_int(t, "max_position_embeddings", tw, 128000);
  read_rope(t, tw, c);
  const std::string act = json_string(t, "hidden_act", tw, "silu");
  VLM_CHECK(act == "silu", tw, ": key 'hidden_act' is '", act,
            "'; the text MLP is SwiGLU (\"silu\"), nothing else is implemented");
  c.tie_word_embeddings =
      json_bool(j, "tie_word_embeddings", where, json_bool(t, "tie_word_embeddings", tw, false));

  const std::string vw = where + " (vision_config)";
  const json v = json_object(j, "vision_config", where);
  c.vision = VisionConfig::from_json(v, vw);
  c.vision_model_type = json_string(v, "model_type", vw, "qwen3_vl_vision");
  c.image_token_id = json_int(j, "image_token_id", where, c.image_token_id);
  c.video_token_id = json_int(j, "video_token_id", where, c.video_token_id);
  c.vision_start_token_id = json_int(j, "vision_start_token_id", where, c.vision_start_token_id);
  c.vision_end_token_id = json_int(j, "vision_end_token_id", where, c.vision_end_token_id);
  c.torch_dtype =
      json_string(j, "dtype", where,
                  json_string(j, "torch_dtype", where, json_string(t, "dtype", tw, "bfloat16")));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (has_key(t, key)) c.token_ids[key] = t[key];
    if (has_key(j, key)) c.token_ids[key] = j[key];
  }
  try {
    c.validate();
  } catch (const Error& e) {
    VLM_FAIL(where, ": ", e.what());
  }
  return c;
}

json Qwen3VLConfig::to_json() const {
  json t;
  t["model_type"] = "qwen3_vl_text";
  t["vocab_size"] = vocab_size;
  t["hidden_size"] = hidden_size;
  t["intermediate_size"] = intermediate_size;
  t["num_hidden_layers"] = num_hidden_layers;
  t["num_attention_heads"] = num_attention_heads;
  t["num_key_value_heads"] = num_key_value_heads;
  t["head_dim"] = head_dim;
  t["hidden_act"] = "silu";
  t["rms_norm_eps"] = rms_norm_eps;
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", rope_theta},
                          {"mrope_section", mrope_section},
                          {"mrope_interleaved", true}};
  t["attention_bias"] = attention_bias;
  t["attention_dropout"] = 0.0;
  t["initializer_range"] = initializer_range;
  t["max_position_embeddings"] = max_position_embeddings;
  t["tie_word_embeddings"] = tie_word_embeddings;
  t["use_cache"] = true;
  t["dtype"] = torch_dtype;

  json j;
  j["architectures"] = {"Qwen3VLForConditionalGeneration"};
  j["model_type"] = "qwen3_vl";
  j["text_config"] = t;
  j["vision_config"] = vision.to_json(vision_model_type);
  j["image_token_id"] = image_token_id;
  j["video_token_id"] = video_token_id;
  j["vision_start_token_id"] = vision_start_token_id;
  j["vision_end_token_id"] = vision_end_token_id;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["dtype"] = torch_dtype;
  j["torch_dtype"] = torch_dtype;
  for (const auto& [k, val] : token_ids.items()) {
    j[k] = val;
    j["text_config"][k] = val;
  }
  return j;
}

int64_t Qwen3VLConfig::num_parameters() const {
  const int64_t H = hidden_size, D = head_dim, q = num_attention_heads * D,
                kv = num_key_value_heads * D;
  int64_t attn = H * q + 2 * H * kv + q * H + 2 * D;
  if (attention_bias) attn += q + 2 * kv + H;
  const int64_t layer = attn + 3 * H * intermediate_size + 2 * H;
  return vocab_size * H * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + H +
         vision.num_parameters();
}

std::string Qwen3VLConfig::summary() const {
  std::ostringstream os;
  os << "Qwen3-VL(text H=" << hidden_size << ", L=" << num_hidden_layers
     << ", Hq=" << num_attention_heads << ", Hkv=" << num_key_value_heads << ", D=" << head_dim
     << ", I=" << intermediate_size << ", vocab=" << vocab_size
     << (tie_word_embeddings ? ", tied" : ", untied") << "; vision depth=" << vision.depth
     << ", Hv=" << vision.hidden_size << ", heads=" << vision.num_heads
     << ", Iv=" << vision.intermediate_size
     << ", deepstack=" << vision.deepstack_visual_indexes.size() << ")";
  return os.str();
}

Qwen3VLConfig tiny_qwen3_vl_config(bool tie_word_embeddings) {
  Qwen3VLConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.rope_theta = 5e6;
  c.mrope_section = {6, 5, 5};
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = tie_word_embeddings;
  c.vision.depth = 4;
  c.vision.hidden_size = 64;
  c.vision.intermediate_size = 128;
  c.vision.num_heads = 4;
  c.vision.out_hidden_size = 64;
  c.vision.num_position_embeddings = 64;
  c.vision.deepstack_visual_indexes = {0, 2, 3};
  c.image_token_id = 500;
  c.video_token_id = 501;
  c.vision_start_token_id = 502;
  c.vision_end_token_id = 503;
  c.torch_dtype = "float32";
  return c;
}

} // namespace vlm::model
