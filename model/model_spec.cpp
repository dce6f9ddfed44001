#include "model/model_spec.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "model/hf_weights.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

struct Registry {
  std::mutex mu;
  std::deque<ModelSpec> specs; // a deque: references stay valid when a family is added
  bool loaded = false;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Every registered spec, the built-in ones added on first use; specs are never removed.
std::deque<ModelSpec>& specs_locked(Registry& r) {
  if (!r.loaded) {
    r.loaded = true;
    for (auto& s : builtin_model_specs()) r.specs.push_back(std::move(s));
  }
  return r.specs;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

} // namespace

void register_model_spec(ModelSpec spec) {
  VLM_CHECK(!spec.model_type.empty() && spec.build, "register_model_spec: a spec needs a ",
            "model_type and a build function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& specs = specs_locked(r);
  for (const auto& s : specs) {
    VLM_CHECK(s.model_type != spec.model_type, "register_model_spec: model_type '", spec.model_type,
              "' is already registered");
    for (const auto& [name, fn] : spec.presets)
      VLM_CHECK(!s.presets.count(name), "register_model_spec: preset '", name, "' of '",
                spec.model_type, "' is already a preset of '", s.model_type, "'");
  }
  specs.push_back(std::move(spec));
}

std::vector<std::string> registered_model_types() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> types;
  for (const auto& s : specs_locked(r)) types.push_back(s.model_type);
  return types;
}

const ModelSpec& model_spec(const std::string& model_type) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& s : specs_locked(r))
      if (s.model_type == model_type) return s;
  }
  VLM_FAIL("unknown model_type '", model_type,
           "'; registered model types: ", join(registered_model_types()));
}

namespace {

std::string config_path(const std::string& snapshot_dir) {
  namespace fs = std::filesystem;
  return fs::is_directory(snapshot_dir) ? (fs::path(snapshot_dir) / "config.json").string()
                                        : snapshot_dir;
}

} // namespace

nlohmann::json read_config_json(const std::string& snapshot_dir) {
  const std::string path = config_path(snapshot_dir);
  std::ifstream f(path);
  VLM_CHECK(f.good(), "cannot open ", path, " (an HF snapshot folder needs config.json)");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL(path, ": not valid JSON: ", e.what());
  }
}

std::shared_ptr<CausalLM> build_model(const nlohmann::json& config, const std::string& where,
                                      DType param_dtype) {
  VLM_CHECK(config.is_object(), where, ": a config.json must hold a JSON object");
  auto it = config.find("model_type");
  VLM_CHECK(it != config.end() && it->is_string(), where,
            ": no \"model_type\" string; registered model types: ", join(registered_model_types()));
  return model_spec(it->get<std::string>()).build(config, where, param_dtype);
}

std::vector<std::string> preset_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& s : specs_locked(r))
    for (const auto& [name, fn] : s.presets) names.push_back(name);
  return names;
}

nlohmann::json preset_config(const std::string& preset, const PresetOptions& options) {
  std::function<nlohmann::json(const PresetOptions&)> make;
  std::vector<std::string> names;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& s : specs_locked(r))
      for (const auto& [name, fn] : s.presets) {
        names.push_back(name + " (" + s.model_type + ")");
        if (name == preset) make = fn;
      }
  }
  VLM_CHECK(make, "unknown model preset '", preset, "'; presets: ", join(names));
  return make(options);
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& snapshot_dir, DType param_dtype) {
  auto model = build_model(read_config_json(snapshot_dir), config_path(snapshot_dir), param_dtype);
  model->stored() = load_hf_weights(*model, snapshot_dir, model->carried_prefixes());
  return model;
}

ModelSpec refused_model_spec(const std::string& model_type, const std::string& what,
                             const std::string& reason) {
  ModelSpec s;
  s.model_type = model_type;
  s.description = what + ": not supported, refused";
  s.build = [=](const nlohmann::json&, const std::string& where,
                DType) -> std::shared_ptr<CausalLM> {
    VLM_FAIL(where, ": model_type \"", model_type, "\" (", what, ") is not supported: ", reason);
  };
  return s;
}

parallel::TpPlan tp_plan(const CausalLM& model) {
  const ModelSpec& spec = model_spec(model.model_type());
  VLM_CHECK(spec.tp_plan, "model_type \"", model.model_type(),
            "\" has no tensor-parallel plan: set parallel.tp_size = 1");
  return spec.tp_plan(model);
}

} // namespace vlm::model
