// The ModelSpec registry (DESIGN.md §4.1, torchtitan's ModelSpec): one entry per model family,
// keyed by HF config.json's `model_type`. Everything outside model/ builds models through it, so
// adding a family is one folder (model/<family>/) plus one line in model/registry.cpp.
//
// The life cycle it serves (DESIGN.md §2): spec.build describes a model (declares parameters,
// allocates nothing) -> parallelism applied from outside -> materialize -> init (CausalLM::
// init_weights) or load (model/hf_weights.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "parallel/tp/tensor_parallel.h"

namespace vlm::model {

// What a built-in config may adapt to the run: a vocabulary at least this large (the tokenizer's
// size, rounded up as the preset likes; 0 keeps the preset's) and, for VLMs, the tokenizer's ids
// of <|image_pad|>, <|video_pad|>, <|vision_start|>, <|vision_end|> (-1 keeps the preset's).
struct PresetOptions {
  int64_t min_vocab_size = 0;
  int64_t image_token_id = -1;
  int64_t video_token_id = -1;
  int64_t vision_start_token_id = -1;
  int64_t vision_end_token_id = -1;
};

struct ModelSpec {
  std::string model_type;  // config.json "model_type", e.g. "qwen3"
  std::string description; // one line for listings, e.g. "Qwen3 dense text model"
  // Describes the model of a config.json object in `param_dtype` (parameters declared, none
  // allocated). `where` (the file) prefixes every config error.
  std::function<std::shared_ptr<CausalLM>(const nlohmann::json& config, const std::string& where,
                                          DType param_dtype)>
      build;
  // What tensor parallelism splits (parallel/tp/tensor_parallel.h) in a model `build` made; empty:
  // the family has no plan and tp > 1 is an error.
  std::function<parallel::TpPlan(const CausalLM& model)> tp_plan;
  // Built-in configs by name (model.preset), as config.json objects for `build`.
  std::map<std::string, std::function<nlohmann::json(const PresetOptions&)>> presets;
};

// A model_type that is known but not implemented (the MoE siblings): its build fails with
// "<where>: model_type \"<model_type>\" (<what>) is not supported: <reason>".
ModelSpec refused_model_spec(const std::string& model_type, const std::string& what,
                             const std::string& reason);

// The built-in families, one line each (model/registry.cpp); registered on first use.
std::vector<ModelSpec> builtin_model_specs();
// Adds a family at run time (tests, plugins). A model_type or preset name registered twice is an
// error.
void register_model_spec(ModelSpec spec);
// The spec of a model_type; unknown ones are an error that lists the registered types.
const ModelSpec& model_spec(const std::string& model_type);
std::vector<std::string> registered_model_types();

// `<dir>/config.json` (or the file itself when given a .json path), parsed; errors name the file.
nlohmann::json read_config_json(const std::string& snapshot_dir);
// The model a config.json object describes (its model_type picks the spec); nothing allocated.
std::shared_ptr<CausalLM> build_model(const nlohmann::json& config, const std::string& where,
                                      DType param_dtype);
// The tensor-parallel plan of `model` by its family's spec; a family without one is an error.
parallel::TpPlan tp_plan(const CausalLM& model);
// Every preset name, over every family.
std::vector<std::string> preset_names();
// A built-in config by preset name, over every family (the error lists the presets).
nlohmann::json preset_config(const std::string& preset, const PresetOptions& options = {});
// config.json -> build -> weights loaded by name (materialized on the CPU).
std::shared_ptr<CausalLM> load_pretrained(const std::string& snapshot_dir, DType param_dtype);

} // namespace vlm::model
