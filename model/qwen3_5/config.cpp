#include "model/qwen3_5/config.h"

#include <cmath>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

using nlohmann::json;

constexpr const char* kLinear = "linear_attention";
constexpr const char* kFull = "full_attention";
// Read by nobody (transformers neither), written back as they came.
constexpr const char* kCarriedKeys[] = {"attn_output_gate", "mamba_ssm_dtype",
                                        "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
                                        "full_attention_interval"};

// The text side's RoPE: rope_parameters (transformers 5) or the legacy rope_scaling + rope_theta.
void read_rope(const json& t, const std::string& where, Qwen3_5Config& c) {
  const char* key = has_key(t, "rope_parameters") ? "rope_parameters" : "rope_scaling";
  c.rope_theta = json_double(t, "rope_theta", where, 10000.0);
  c.partial_rotary_factor = json_double(t, "partial_rotary_factor", where, 0.25);
  if (!has_key(t, key)) return;
  const json& r = t[key];
  const std::string sub = where + " (" + key + ")";
  const std::string type = rope_type_of(r, key, where);
  VLM_CHECK(type == "default" || type == "mrope", where, ": key '", key, ".rope_type' is '", type,
            "'; Qwen3.5's text RoPE is the default (interleaved MRoPE) one");
  c.rope_theta = json_double(r, "rope_theta", sub, c.rope_theta);
  c.partial_rotary_factor = json_double(r, "partial_rotary_factor", sub, c.partial_rotary_factor);
  const auto sec = json_int_list(r, "mrope_section", sub, {11, 11, 10});
  VLM_CHECK(sec.size() == 3, where, ": key '", key, ".mrope_section' must have 3 entries (t, h, w)",
            ", got ", sec.size());
  c.mrope_section = {sec[0], sec[1], sec[2]};
}

void read_layer_types(const json& t, const std::string& where, Qwen3_5Config& c) {
  c.layer_types.clear();
  if (!has_key(t, "layer_types")) {
    const int64_t interval = json_int(t, "full_attention_interval", where, 4);
    VLM_CHECK(interval >= 1, where, ": key 'full_attention_interval' must be >= 1, got ", interval);
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      c.layer_types.push_back((i + 1) % interval == 0 ? kFull : kLinear);
    return;
  }
  const json& types = t["layer_types"];
  VLM_CHECK(types.is_array(), where, ": key 'layer_types' must be a list, got ", types.dump());
  for (size_t i = 0; i < types.size(); i++) {
    VLM_CHECK(types[i] == kLinear || types[i] == kFull, where, ": key 'layer_types' entry ", i,
              " is ", types[i].dump(), "; expected \"", kLinear, "\" or \"", kFull, "\"");
    c.layer_types.push_back(types[i].get<std::string>());
  }
}

} // namespace

Qwen3_5Config::Qwen3_5Config() {
  vocab_size = 248320;
  head_dim = 256;
  rope_theta = 10000000.0;
  max_position_embeddings = 262144;
  vision_model_type = "qwen3_5_vision";
  vision.deepstack_visual_indexes.clear();
  image_token_id = 248056;
  video_token_id = 248057;
  vision_start_token_id = 248053;
  vision_end_token_id = 248054;
}

int64_t Qwen3_5Config::rotary_dim() const {
  return int64_t(std::llround(double(head_dim) * partial_rotary_factor));
}

bool Qwen3_5Config::is_linear_attention(int64_t layer) const {
  return layer_types.at(size_t(layer)) == kLinear;
}

int64_t Qwen3_5Config::num_linear_attention_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < int64_t(layer_types.size()); i++) n += is_linear_attention(i);
  return n;
}

DecoderLayerConfig Qwen3_5Config::decoder_layer() const {
  DecoderLayerConfig d = TextConfig::decoder_layer();
  d.zero_centered_norms = true;
  d.attention_output_gate = true;
  return d;
}

GatedDeltaNetConfig Qwen3_5Config::gated_deltanet() const {
  GatedDeltaNetConfig g;
  g.hidden_size = hidden_size;
  g.num_key_heads = linear_num_key_heads;
  g.num_value_heads = linear_num_value_heads;
  g.key_head_dim = linear_key_head_dim;
  g.value_head_dim = linear_value_head_dim;
  g.conv_kernel_size = linear_conv_kernel_dim;
  g.rms_norm_eps = rms_norm_eps;
  g.initializer_range = initializer_range;
  return g;
}

void Qwen3_5Config::validate() const {
  const std::string who = "Qwen3_5Config";
  validate_text(who + " (text)");
  VLM_CHECK(int64_t(layer_types.size()) == num_hidden_layers, who, ": layer_types has ",
            layer_types.size(), " entries for ", num_hidden_layers, " layers");
  const int64_t R = rotary_dim();
  VLM_CHECK(partial_rotary_factor > 0 && partial_rotary_factor <= 1 && R % 2 == 0 &&
                std::abs(double(R) - double(head_dim) * partial_rotary_factor) < 1e-9,
            who, ": partial_rotary_factor ", partial_rotary_factor,
            " must be in (0, 1] and give "
            "an even whole number of rotary dims of head_dim ",
            head_dim);
  VLM_CHECK(mrope_section[0] >= 0 && mrope_section[1] >= 0 && mrope_section[2] >= 0 &&
                mrope_section[0] + mrope_section[1] + mrope_section[2] == R / 2,
            who, ": mrope_section [", mrope_section[0], ", ", mrope_section[1], ", ",
            mrope_section[2], "] must be non-negative and sum to rotary_dim / 2 = ", R / 2);
  for (auto [name, v] : {std::pair{"linear_num_key_heads", linear_num_key_heads},
                         {"linear_num_value_heads", linear_num_value_heads},
                         {"linear_key_head_dim", linear_key_head_dim},
                         {"linear_value_head_dim", linear_value_head_dim},
                         {"linear_conv_kernel_dim", linear_conv_kernel_dim}})
    VLM_CHECK(v >= 1 && v <= 65536, who, ": ", name, " must be in [1, 65536], got ", v);
  VLM_CHECK(linear_num_value_heads % linear_num_key_heads == 0, who, ": linear_num_value_heads (",
            linear_num_value_heads, ") must be a multiple of linear_num_key_heads (",
            linear_num_key_heads, ")");
  validate_vision(who, vocab_size, hidden_size);
  VLM_CHECK(vision.deepstack_visual_indexes.empty(), who,
            ": Qwen3.5's vision tower has no DeepStack, got deepstack_visual_indexes of size ",
            vision.deepstack_visual_indexes.size());
}

Qwen3_5Config Qwen3_5Config::from_json(const json& j, const std::string& where) {
  const json t = vlm_text_config(j, where, "qwen3_5", "qwen3_5_text", "dense Qwen3.5");
  const std::string tw = where + " (text_config)";
  Qwen3_5Config c;
  c.read_text_json(t, tw, TextDefaults{248320, 256, 262144});
  read_rope(t, tw, c);
  read_layer_types(t, tw, c);
  c.linear_num_key_heads = json_int(t, "linear_num_key_heads", tw, 16);
  c.linear_num_value_heads = json_int(t, "linear_num_value_heads", tw, 32);
  c.linear_key_head_dim = json_int(t, "linear_key_head_dim", tw, 128);
  c.linear_value_head_dim = json_int(t, "linear_value_head_dim", tw, 128);
  c.linear_conv_kernel_dim = json_int(t, "linear_conv_kernel_dim", tw, 4);
  for (const char* key : kCarriedKeys)
    if (t.contains(key)) c.carried_text_keys[key] = t[key];
  read_vlm_config(j, t, where, "qwen3_5_vision", c, c);
  try {
    c.validate();
  } catch (const Error& e) {
    VLM_FAIL(where, ": ", e.what());
  }
  return c;
}

json Qwen3_5Config::to_json() const {
  json t = carried_text_keys;
  t["model_type"] = "qwen3_5_text";
  write_text_json(t);
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", rope_theta},
                          {"partial_rotary_factor", partial_rotary_factor},
                          {"mrope_section", mrope_section},
                          {"mrope_interleaved", true}};
  t["layer_types"] = layer_types;
  t["linear_num_key_heads"] = linear_num_key_heads;
  t["linear_num_value_heads"] = linear_num_value_heads;
  t["linear_key_head_dim"] = linear_key_head_dim;
  t["linear_value_head_dim"] = linear_value_head_dim;
  t["linear_conv_kernel_dim"] = linear_conv_kernel_dim;

  json j = vlm_config_json(t, "Qwen3_5ForConditionalGeneration", "qwen3_5", *this, *this);
  j["vision_config"].erase("deepstack_visual_indexes");
  return j;
}

int64_t Qwen3_5Config::num_parameters() const {
  const int64_t H = hidden_size, D = head_dim, q = num_attention_heads * D,
                kv = num_key_value_heads * D;
  const int64_t mlp_norms = mlp_matmul_params() + 2 * H;
  const int64_t attention = 2 * H * q + 2 * H * kv + q * H + 2 * D + mlp_norms;
  const int64_t linear = gated_deltanet().num_parameters() + mlp_norms;
  const int64_t n_linear = num_linear_attention_layers();
  return embedding_parameters() + n_linear * linear + (num_hidden_layers - n_linear) * attention +
         vision.num_parameters();
}

std::string Qwen3_5Config::summary() const {
  std::ostringstream os;
  os << "Qwen3.5(text " << text_summary() << ", " << num_linear_attention_layers()
     << " Gated DeltaNet layers (HK=" << linear_num_key_heads << ", HV=" << linear_num_value_heads
     << ", dk=" << linear_key_head_dim << ", dv=" << linear_value_head_dim << "), rotary "
     << rotary_dim() << "; " << vision_summary() << ")";
  return os.str();
}

Qwen3_5Config tiny_qwen3_5_config(bool tie_word_embeddings) {
  Qwen3_5Config c;
  c.set_tiny_sizes();
  c.intermediate_size = 16;
  c.num_hidden_layers = 8;
  c.head_dim = 64;
  c.rope_theta = 1e7;
  c.mrope_section = {3, 3, 2};
  c.tie_word_embeddings = tie_word_embeddings;
  for (int64_t i = 0; i < c.num_hidden_layers; i++)
    c.layer_types.push_back((i + 1) % 4 == 0 ? kFull : kLinear);
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 32;
  c.linear_value_head_dim = 16;
  c.set_tiny_vision();
  c.vision.depth = 2;
  c.vision.hidden_size = 16;
  c.vision.intermediate_size = 32;
  c.vision.num_heads = 1;
  c.vision.deepstack_visual_indexes.clear();
  return c;
}

} // namespace vlm::model
