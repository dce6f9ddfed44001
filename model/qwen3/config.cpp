#include "model/qwen3/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

using nlohmann::json;

// Bounds of the sizes a config.json may declare (far above any real Qwen3: vocab 151936,
// hidden 5120, intermediate 25600, 64 layers).
constexpr int64_t kMaxDimension = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;

} // namespace

void Qwen3Config::validate() const {
  // Sizes index int32 kernels and size allocations: each has a stated bound (the product is
  // checked against the machine's memory when the parameters are allocated).
  auto positive = [](const char* name, int64_t v) {
    VLM_CHECK(v > 0 && v <= kMaxDimension, "Qwen3Config: ", name, " must be in [1, ", kMaxDimension,
              "], got ", v);
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
            "Qwen3Config: num_hidden_layers must be <= ", kMaxLayers, ", got ", num_hidden_layers);
  VLM_CHECK(num_attention_heads * head_dim <= kMaxDimension,
            "Qwen3Config: num_attention_heads x head_dim must be <= ", kMaxDimension, ", got ",
            num_attention_heads, " x ", head_dim);
  VLM_CHECK(num_attention_heads % num_key_value_heads == 0, "Qwen3Config: num_attention_heads (",
            num_attention_heads, ") must be a multiple of num_key_value_heads (",
            num_key_value_heads, ")");
  VLM_CHECK(head_dim % 2 == 0, "Qwen3Config: head_dim must be even for RoPE, got ", head_dim);
  VLM_CHECK(rms_norm_eps > 0 && std::isfinite(rms_norm_eps),
            "Qwen3Config: rms_norm_eps must be > 0, got ", rms_norm_eps);
  VLM_CHECK(rope_theta > 0 && std::isfinite(rope_theta),
            "Qwen3Config: rope_theta must be > 0, got ", rope_theta);
  VLM_CHECK(initializer_range >= 0 && std::isfinite(initializer_range),
            "Qwen3Config: initializer_range must be >= 0, got ", initializer_range);
  VLM_CHECK(token_ids.is_object(), "Qwen3Config: token_ids must be a JSON object");
}

Qwen3Config Qwen3Config::from_json(const json& j, const std::string& where) {
  VLM_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  const std::string model_type = json_string(j, "model_type", where, "qwen3");
  VLM_CHECK(model_type == "qwen3", where, ": key 'model_type' is '", model_type,
            "'; this loader reads Qwen3 text models (model_type \"qwen3\") only");
  Qwen3Config c;
  c.vocab_size = json_int(j, "vocab_size", where);
  c.hidden_size = json_int(j, "hidden_size", where);
  c.intermediate_size = json_int(j, "intermediate_size", where);
  c.num_hidden_layers = json_int(j, "num_hidden_layers", where);
  c.num_attention_heads = json_int(j, "num_attention_heads", where);
  c.num_key_value_heads = json_int(j, "num_key_value_heads", where, c.num_attention_heads);
  c.head_dim = json_int(j, "head_dim", where, 128); // transformers' Qwen3Config default
  c.rms_norm_eps = json_double(j, "rms_norm_eps", where, 1e-6);
  c.tie_word_embeddings = json_bool(j, "tie_word_embeddings", where, false);
  c.attention_bias = json_bool(j, "attention_bias", where, false);
  c.initializer_range = json_double(j, "initializer_range", where, 0.02);
  c.max_position_embeddings = json_int(j, "max_position_embeddings", where, 32768);
  // transformers 5 writes "dtype", 4.x "torch_dtype".
  c.torch_dtype = json_string(j, "dtype", where, json_string(j, "torch_dtype", where, "bfloat16"));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (has_key(j, key)) c.token_ids[key] = j[key];

  // RoPE: rope_parameters (transformers 5) wins over the legacy rope_theta / rope_scaling.
  if (has_key(j, "rope_parameters")) {
    const json& r = j["rope_parameters"];
    std::string type = rope_type_of(r, "rope_parameters", where);
    VLM_CHECK(type == "default", where, ": key 'rope_parameters.rope_type' is '", type,
              "'; only \"default\" RoPE is implemented for Qwen3");
    c.rope_theta = json_double(r, "rope_theta", where + " (rope_parameters)",
                               json_double(j, "rope_theta", where, 10000.0));
    VLM_CHECK(!has_key(r, "partial_rotary_factor") || r["partial_rotary_factor"] == 1.0, where,
              ": key 'rope_parameters.partial_rotary_factor' must be 1 for Qwen3, got ",
              r["partial_rotary_factor"].dump());
  } else {
    c.rope_theta = json_double(j, "rope_theta", where, 10000.0);
    if (has_key(j, "rope_scaling")) {
      std::string type = rope_type_of(j["rope_scaling"], "rope_scaling", where);
      VLM_CHECK(type == "default", where, ": key 'rope_scaling' has type '", type,
                "'; only \"default\" RoPE (rope_scaling null) is implemented for Qwen3");
    }
  }

  const std::string act = json_string(j, "hidden_act", where, "silu");
  VLM_CHECK(act == "silu", where, ": key 'hidden_act' is '", act,
            "'; Qwen3's MLP is SwiGLU (\"silu\"), nothing else is implemented");
  VLM_CHECK(!json_bool(j, "use_sliding_window", where, false), where,
            ": key 'use_sliding_window' is true; sliding-window attention is not implemented");
  if (has_key(j, "layer_types")) {
    VLM_CHECK(j["layer_types"].is_array(), where, ": key 'layer_types' must be a list, got ",
              j["layer_types"].dump());
    for (size_t i = 0; i < j["layer_types"].size(); i++)
      VLM_CHECK(j["layer_types"][i] == "full_attention", where, ": key 'layer_types' entry ", i,
                " is ", j["layer_types"][i].dump(), "; only \"full_attention\" is implemented");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    VLM_FAIL(where, ": ", e.what());
  }
  return c;
}

Qwen3Config Qwen3Config::load(const std::string& snapshot_dir) {
  namespace fs = std::filesystem;
  fs::path path = snapshot_dir;
  if (fs::is_directory(path)) path /= "config.json";
  std::ifstream in(path);
  VLM_CHECK(in.good(), path.string(),
            ": cannot open (expected an HF snapshot directory with "
            "config.json)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    VLM_FAIL(path.string(), ": invalid JSON: ", e.what());
  }
  return from_json(j, path.string());
}

json Qwen3Config::to_json() const {
  json j;
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = rms_norm_eps;
  // Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta / rope_scaling.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = initializer_range;
  j["max_position_embeddings"] = max_position_embeddings;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  for (const auto& [k, v] : token_ids.items()) j[k] = v;
  return j;
}

DecoderLayerConfig Qwen3Config::decoder_layer() const {
  return {hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
          head_dim,    rms_norm_eps,      attention_bias,      initializer_range};
}

int64_t Qwen3Config::num_parameters() const {
  const int64_t H = hidden_size, D = head_dim, q = num_attention_heads * D,
                kv = num_key_value_heads * D;
  int64_t attn = H * q + 2 * H * kv + q * H + 2 * D;
  if (attention_bias) attn += q + 2 * kv + H;
  const int64_t layer = attn + 3 * H * intermediate_size + 2 * H;
  return vocab_size * H * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + H;
}

std::string Qwen3Config::summary() const {
  std::ostringstream os;
  os << "Qwen3(H=" << hidden_size << ", L=" << num_hidden_layers << ", Hq=" << num_attention_heads
     << ", Hkv=" << num_key_value_heads << ", D=" << head_dim << ", I=" << intermediate_size
     << ", vocab=" << vocab_size << (tie_word_embeddings ? ", tied" : ", untied")
     << (attention_bias ? ", attention bias" : "") << ")";
  return os.str();
}

Qwen3Config tiny_qwen3_config(bool tie_word_embeddings) {
  Qwen3Config c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = tie_word_embeddings;
  c.max_position_embeddings = 4096;
  c.torch_dtype = "float32";
  return c;
}

} // namespace vlm::model
