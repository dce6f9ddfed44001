#include "model/qwen3_vl/config.h"

#include <cmath>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

using nlohmann::json;

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

Qwen3VLConfig::Qwen3VLConfig() {
  rope_theta = 500000.0;
  max_position_embeddings = 128000;
  vision_model_type = "qwen3_vl_vision";
}

void Qwen3VLConfig::validate() const {
  validate_text("Qwen3VLConfig (text)");
  VLM_CHECK(mrope_section[0] >= 0 && mrope_section[1] >= 0 && mrope_section[2] >= 0 &&
                mrope_section[0] + mrope_section[1] + mrope_section[2] == head_dim / 2,
            "Qwen3VLConfig: mrope_section [", mrope_section[0], ", ", mrope_section[1], ", ",
            mrope_section[2], "] must be non-negative and sum to head_dim / 2 = ", head_dim / 2);
  validate_vision("Qwen3VLConfig", vocab_size, hidden_size);
  VLM_CHECK(int64_t(vision.deepstack_visual_indexes.size()) <= num_hidden_layers,
            "Qwen3VLConfig: ", vision.deepstack_visual_indexes.size(),
            " DeepStack features need as many text layers, the model has ", num_hidden_layers);
}

Qwen3VLConfig Qwen3VLConfig::from_json(const json& j, const std::string& where) {
  const json t = vlm_text_config(j, where, "qwen3_vl", "qwen3_vl_text", "dense Qwen3-VL");
  const std::string tw = where + " (text_config)";
  Qwen3VLConfig c;
  c.read_text_json(t, tw, TextDefaults{151936, 128, 128000});
  read_rope(t, tw, c);
  read_vlm_config(j, t, where, "qwen3_vl_vision", c, c);
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
  write_text_json(t);
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", rope_theta},
                          {"mrope_section", mrope_section},
                          {"mrope_interleaved", true}};

  return vlm_config_json(t, "Qwen3VLForConditionalGeneration", "qwen3_vl", *this, *this);
}

int64_t Qwen3VLConfig::num_parameters() const {
  return embedding_parameters() + num_hidden_layers * decoder_layer_parameters() +
         vision.num_parameters();
}

std::string Qwen3VLConfig::summary() const {
  return "Qwen3-VL(text " + text_summary() + "; " + vision_summary() + ")";
}

Qwen3VLConfig tiny_qwen3_vl_config(bool tie_word_embeddings) {
  Qwen3VLConfig c;
  c.set_tiny_sizes();
  c.num_hidden_layers = 4;
  c.head_dim = 32;
  c.rope_theta = 5e6;
  c.mrope_section = {6, 5, 5};
  c.tie_word_embeddings = tie_word_embeddings;
  c.set_tiny_vision();
  return c;
}

} // namespace vlm::model
