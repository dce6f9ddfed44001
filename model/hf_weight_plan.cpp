#include "model/hf_weight_plan.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "src/base/check.h"

namespace vlm::model {

namespace fs = std::filesystem;

namespace {

bool is_loadable_dtype(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

bool has_any_prefix(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (name.compare(0, p.size(), p) == 0) return true;
  return false;
}

// The file `dir`/`name`, its header read; one that is absent or whose header does not parse keeps
// the reason (no exception: one bad shard must not hide the others' problems). A truncated file is
// a problem line.
SnapshotFile read_snapshot_file(HfWeightPlan& plan, const fs::path& dir, const std::string& name) {
  SnapshotFile f;
  f.name = name;
  const fs::path path = dir / name;
  if (!fs::exists(path)) {
    f.error = name + " does not exist";
    return f;
  }
  try {
    f.header = io::read_safetensors_header(path.string());
  } catch (const Error& e) {
    f.error = "unreadable: " + name + ": " + e.what();
    return f;
  }
  const io::SafetensorsHeader& h = f.header;
  if (const io::TensorInfo* cut = h.first_cut_off()) {
    size_t cut_count = 0;
    for (size_t i = 0; i < h.tensors.size(); i++) cut_count += h.cut_off(i);
    plan.file_problems.push_back("  truncated: " + name + " has " + std::to_string(h.file_size) +
                                 " bytes, its header needs " + std::to_string(h.needed_size()) +
                                 "; " + std::to_string(cut_count) + " of its " +
                                 std::to_string(h.tensors.size()) +
                                 " tensors cut off, the first: " + cut->name);
  }
  return f;
}

// The files and tensors of the snapshot; names the index puts in a file that could not be read
// go to `unreadable`.
void read_snapshot_files(HfWeightPlan& plan, const fs::path& dir,
                         std::set<std::string>& unreadable) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    VLM_CHECK(fs::exists(dir / "model.safetensors"), dir.string(),
              ": no model.safetensors or model.safetensors.index.json (expected an HF snapshot "
              "directory)");
    plan.files.push_back(read_snapshot_file(plan, dir, "model.safetensors"));
    const SnapshotFile& f = plan.files.back();
    if (!f.readable()) plan.file_problems.push_back("  " + f.error);
    for (size_t i = 0; i < f.header.tensors.size(); i++)
      plan.tensors[f.header.tensors[i].name] = {0, i};
    return;
  }
  nlohmann::json j;
  std::ifstream in(index);
  VLM_CHECK(in.good(), index.string(), ": cannot open");
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL(index.string(), ": invalid JSON: ", e.what());
  }
  VLM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
            index.string(), ": missing the object 'weight_map' (tensor name -> file)");
  std::map<std::string, size_t> file_index;                  // file name -> plan.files
  std::vector<std::map<std::string, size_t>> tensor_index;   // per file: tensor -> index
  std::vector<std::vector<std::string>> names_of_unreadable; // per file, for its line
  for (const auto& [name, file_json] : j["weight_map"].items()) {
    VLM_CHECK(file_json.is_string(), index.string(), ": weight_map['", name,
              "'] must be a file name, got ", file_json.dump());
    const std::string file = file_json.get<std::string>();
    auto it = file_index.find(file);
    if (it == file_index.end()) {
      plan.files.push_back(read_snapshot_file(plan, dir, file));
      tensor_index.emplace_back();
      names_of_unreadable.emplace_back();
      const auto& tensors = plan.files.back().header.tensors;
      for (size_t i = 0; i < tensors.size(); i++) tensor_index.back()[tensors[i].name] = i;
      it = file_index.emplace(file, plan.files.size() - 1).first;
    }
    const size_t f = it->second;
    if (!plan.files[f].readable()) {
      unreadable.insert(name);
      names_of_unreadable[f].push_back(name);
      continue;
    }
    auto t = tensor_index[f].find(name);
    if (t == tensor_index[f].end()) {
      plan.file_problems.push_back("  listed in the index but absent from its file: " + name +
                                   " (" + file + ")");
      continue;
    }
    plan.tensors[name] = {f, t->second};
  }
  for (size_t f = 0; f < plan.files.size(); f++) {
    const auto& names = names_of_unreadable[f];
    if (!plan.files[f].readable())
      plan.file_problems.push_back(
          "  " + plan.files[f].error + " (model.safetensors.index.json names it for " +
          std::to_string(names.size()) + (names.size() == 1 ? " tensor: " : " tensors: ") +
          names.front() + (names.size() > 1 ? ", ...)" : ")"));
  }
}

} // namespace

const io::TensorInfo& HfWeightPlan::info(const std::string& name) const {
  const TensorPlace& p = tensors.at(name);
  return files[p.file].header.tensors[p.index];
}

size_t HfWeightPlan::problem_count() const {
  return file_problems.size() + missing.size() + unexpected.size() + wrong.size();
}

std::string HfWeightPlan::problems_message(const std::string& dir, const std::string& model,
                                           size_t max_lines) const {
  std::ostringstream os;
  os << dir << ": the snapshot's weights cannot be loaded into the " << model << " ("
     << missing.size() << " missing, " << unexpected.size() << " unexpected, " << wrong.size()
     << " wrong shape/dtype, " << file_problems.size() << " file or index problems";
  if (unchecked) os << "; " << unchecked << " parameters in unreadable files not checked";
  os << "):";
  size_t shown = 0;
  for (const auto* list : {&file_problems, &missing, &unexpected, &wrong})
    for (const auto& line : *list)
      if (shown++ < max_lines) os << "\n" << line;
  if (shown > max_lines) os << "\n  ... and " << shown - max_lines << " more";
  return os.str();
}

HfWeightPlan plan_hf_weights(const std::vector<nn::ParameterSpec>& params, const std::string& dir,
                             const std::vector<std::string>& carried_prefixes) {
  VLM_CHECK(fs::is_directory(dir), dir, ": not a directory (expected an HF snapshot)");
  HfWeightPlan plan;
  std::set<std::string> unreadable; // named by the index, in a file that could not be read
  read_snapshot_files(plan, dir, unreadable);
  // A single model.safetensors that could not be read: nothing to compare the parameters with.
  const bool nothing_read = plan.files.size() == 1 && !plan.files[0].readable();

  std::set<std::string> names;
  for (const nn::ParameterSpec& p : params) {
    names.insert(p.name);
    if (nothing_read || unreadable.count(p.name)) {
      plan.unchecked++;
      continue;
    }
    auto it = plan.tensors.find(p.name);
    if (it == plan.tensors.end()) {
      plan.missing.push_back("  missing: " + p.name + " " + shape_str(p.shape));
      continue;
    }
    const io::TensorInfo& info = plan.info(p.name);
    const std::string& file = plan.files[it->second.file].name;
    if (info.shape != p.shape)
      plan.wrong.push_back("  wrong shape: " + p.name + " in " + file + ": expected " +
                           shape_str(p.shape) + ", stored " + shape_str(info.shape));
    else if (!is_loadable_dtype(info.dtype))
      plan.wrong.push_back("  wrong dtype: " + p.name + " in " + file + ": stored " +
                           dtype_name(info.dtype) +
                           ", expected a float type (F32, BF16, F16, F64)");
  }
  const bool tied_head = !names.count("lm_head.weight") && names.count("model.embed_tokens.weight");
  for (const auto& [name, place] : plan.tensors) {
    if (names.count(name)) continue;
    const io::TensorInfo& info = plan.info(name);
    const std::string& file = plan.files[place.file].name;
    if ((name == "lm_head.weight" && tied_head) || name.ends_with("rotary_emb.inv_freq")) {
      plan.ignored.push_back(name);
      continue;
    }
    if (has_any_prefix(name, carried_prefixes)) {
      if (!is_loadable_dtype(info.dtype))
        plan.wrong.push_back("  wrong dtype: " + name + " in " + file + ": stored " +
                             dtype_name(info.dtype) +
                             ", expected a float type (F32, BF16, F16, F64)");
      plan.carried.push_back(name);
      continue;
    }
    plan.unexpected.push_back("  unexpected: " + name + " in " + file + " " +
                              shape_str(info.shape));
  }
  return plan;
}

} // namespace vlm::model
