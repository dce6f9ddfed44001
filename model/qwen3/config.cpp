#include "model/qwen3/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

using nlohmann::json;

void Qwen3Config::validate() const { validate_text("Qwen3Config"); }

Qwen3Config Qwen3Config::from_json(const json& j, const std::string& where) {
  VLM_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  const std::string model_type = json_string(j, "model_type", where, "qwen3");
  VLM_CHECK(model_type == "qwen3", where, ": key 'model_type' is '", model_type,
            "'; this loader reads Qwen3 text models (model_type \"qwen3\") only");
  Qwen3Config c;
  c.read_text_json(j, where, TextDefaults{});
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
  write_text_json(j);
  // Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta / rope_scaling.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["torch_dtype"] = torch_dtype;
  return j;
}

int64_t Qwen3Config::num_parameters() const {
  return embedding_parameters() + num_hidden_layers * decoder_layer_parameters();
}

std::string Qwen3Config::summary() const { return "Qwen3(" + text_summary() + ")"; }

Qwen3Config tiny_qwen3_config(bool tie_word_embeddings) {
  Qwen3Config c;
  c.set_tiny_sizes();
  c.num_hidden_layers = 2;
  c.head_dim = 32;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = tie_word_embeddings;
  return c;
}

} // namespace vlm::model
