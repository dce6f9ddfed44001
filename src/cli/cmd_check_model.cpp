#include "src/cli/cmd_check_model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/image/processor_config.h"
#include "io/text/tokenizer.h"
#include "model/hf_weight_plan.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/cli/args.h"

namespace vlm::cli {

namespace {

namespace fs = std::filesystem;

// Problem lines of the weights shown before "... and N more".
constexpr size_t kMaxWeightProblemLines = 20;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// "17.5 GB" (decimal units, as download tools print them).
std::string bytes_str(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, u++;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}

// "8.77e9"
std::string count_str(double n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", n);
  std::string s = buf;
  const size_t e = s.find("e+");
  if (e != std::string::npos) s = s.substr(0, e) + "e" + std::to_string(std::stoi(s.substr(e + 2)));
  return s;
}

// The model as training describes it from config.json (parameters declared, none allocated); an
// unregistered model_type names the file, the value and the known types.
std::shared_ptr<model::CausalLM> describe(const fs::path& dir, nlohmann::json& config) {
  const std::string path = (dir / "config.json").string();
  config = model::read_config_json(dir.string());
  VLM_CHECK(config.is_object(), path, ": a config.json must hold a JSON object");
  const std::vector<std::string> known = model::registered_model_types();
  auto it = config.find("model_type");
  VLM_CHECK(it != config.end() && it->is_string(), path,
            ": no \"model_type\" string; registered model types: ", join(known));
  const std::string type = it->get<std::string>();
  VLM_CHECK(std::find(known.begin(), known.end(), type) != known.end(), path, ": model_type \"",
            type, "\" is not a registered model family; registered model types: ", join(known));
  // bf16: training's default param_dtype (the dtype changes no name or shape).
  return model::build_model(config, path, DType::bf16);
}

// The decoder layers config.json declares (top level, or text_config of a VLM).
int64_t text_layers(const nlohmann::json& config) {
  const nlohmann::json& text = config.contains("text_config") ? config["text_config"] : config;
  return text.is_object() && text.contains("num_hidden_layers") &&
                 text["num_hidden_layers"].is_number_integer()
             ? text["num_hidden_layers"].get<int64_t>()
             : -1;
}

// The weights' part of the summary: "8.77e9 parameters (bf16), 750 tensors in 4 files (17.5 GB)",
// plus what the loader will carry or ignore.
std::string weights_summary(const model::HfWeightPlan& plan,
                            const std::vector<nn::ParameterSpec>& params) {
  double numel = 0;
  std::map<std::string, int64_t> dtypes; // stored dtype -> parameters
  for (const nn::ParameterSpec& p : params) {
    numel += double(vlm::numel(p.shape));
    dtypes[dtype_name(plan.info(p.name).dtype)]++;
  }
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [name, n] : dtypes) by_count.push_back({n, name});
  std::sort(by_count.rbegin(), by_count.rend());
  std::string dtype = by_count.empty() ? "none" : by_count[0].second;
  for (size_t i = 1; i < by_count.size(); i++)
    dtype += " + " + by_count[i].second + " (" + std::to_string(by_count[i].first) + " tensors)";
  uint64_t bytes = 0;
  for (const model::SnapshotFile& f : plan.files) bytes += f.header.file_size;
  std::string s =
      count_str(numel) + " parameters (" + dtype + "), " + std::to_string(plan.tensors.size()) +
      " tensors in " + std::to_string(plan.files.size()) +
      (plan.files.size() == 1 ? " file (" : " files (") + bytes_str(double(bytes)) + ")";
  if (!plan.carried.empty())
    s += ", " + std::to_string(plan.carried.size()) + " carried unused (kept as stored)";
  if (!plan.ignored.empty())
    s += ", " + std::to_string(plan.ignored.size()) +
         " ignored (a tied head, rotary buffers; transformers drops them too)";
  return s;
}

// tokenizer.json loads with the trainer's tokenizer and fits the model's vocabulary (the
// trainer's own check); tokenizer_config.json, which training does not read, must be valid JSON
// when present (a cut download). Returns the tokenizer's size.
int64_t check_tokenizer(const fs::path& dir, const model::CausalLM& m) {
  const fs::path path = dir / "tokenizer.json";
  VLM_CHECK(fs::exists(path), path.string(),
            ": missing (training reads the tokenizer from the snapshot unless model.tokenizer "
            "names another)");
  const io::Tokenizer tok = io::Tokenizer::from_file(path.string());
  VLM_CHECK(tok.vocab_size() <= m.vocab_size(), path.string(), ": ", tok.vocab_size(),
            " tokens, but config.json's vocab_size is ", m.vocab_size());
  const fs::path config = dir / "tokenizer_config.json";
  if (fs::exists(config)) {
    std::ifstream in(config);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      VLM_FAIL(config.string(), ": not valid JSON: ", e.what());
    }
    VLM_CHECK(j.is_object(), config.string(), ": must hold a JSON object");
  }
  return tok.vocab_size();
}

// preprocessor_config.json of a vision model, read as `vlmtrain generate` reads it (training
// takes the pixel bounds from its config but writes this file into every snapshot it saves).
void check_preprocessor(const fs::path& dir) {
  const fs::path path = dir / "preprocessor_config.json";
  VLM_CHECK(fs::exists(path), path.string(),
            ": missing (a vision model's snapshot needs its image processor config)");
  (void)io::read_image_processor_config(path.string());
}

} // namespace

int cmd_check_model(const std::vector<std::string>& args) {
  std::string dir_name;
  CLI::App app{"Checks an HF snapshot folder before training: config.json (a registered "
               "model_type, the model described as training describes it), the safetensors "
               "headers against every parameter (name, shape, float dtype), every tensor's bytes "
               "inside its file (a truncated or incomplete download), tokenizer.json and, for a "
               "vision model, preprocessor_config.json. Reads headers only: nothing of the "
               "weights is allocated or read, so it takes seconds for any model size.",
               "vlmtrain check-model"};
  app.add_option("dir", dir_name, "the HF snapshot folder (as `hf download --local-dir` wrote it)")
      ->required();
  if (!parse_args(app, args)) return 0;
  const fs::path dir = dir_name;
  VLM_CHECK(fs::exists(dir), "check-model: ", dir_name, " does not exist");
  VLM_CHECK(fs::is_directory(dir), "check-model: ", dir_name, " is not a folder");

  nlohmann::json config;
  const std::shared_ptr<model::CausalLM> m = describe(dir, config); // nothing else without it
  const std::vector<nn::ParameterSpec> params = m->parameter_specs();

  // Every other check runs, and every problem is listed, before failing.
  std::vector<std::string> problems;
  auto run = [&](const std::function<void()>& check) {
    try {
      check();
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  };
  std::string weights, tokenizer, vision;
  run([&] {
    const model::HfWeightPlan plan =
        model::plan_hf_weights(params, dir_name, m->carried_prefixes());
    if (plan.problem_count())
      problems.push_back(plan.problems_message(dir_name, m->type_name(), kMaxWeightProblemLines));
    else
      weights = weights_summary(plan, params);
  });
  run([&] { tokenizer = "tokenizer " + std::to_string(check_tokenizer(dir, *m)) + " tokens"; });
  if (m->has_vision())
    run([&] {
      check_preprocessor(dir);
      vision = ", preprocessor_config.json: ok";
    });
  if (!problems.empty()) {
    std::string msg = "check-model: " + dir_name + " is not ready to train (" +
                      std::to_string(problems.size()) +
                      (problems.size() == 1 ? " problem):" : " problems):");
    for (const auto& p : problems) msg += "\n" + p;
    VLM_FAIL(msg);
  }
  const int64_t n = text_layers(config);
  const std::string layers = (n > 0 ? std::to_string(n) : "?") + " layers";
  std::printf("check-model: %s is a %s snapshot: %s, %s, %s%s\n", dir_name.c_str(),
              m->model_type().c_str(), layers.c_str(), weights.c_str(), tokenizer.c_str(),
              vision.c_str());
  return 0;
}

} // namespace vlm::cli
