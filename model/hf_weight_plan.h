// Which tensor of which file of an HF snapshot feeds which parameter, planned from the safetensors
// headers alone (no tensor data mapped or read) and checked against the parameters a model
// declares. One check, two users: load_hf_weights plans before it allocates or reads anything,
// and `vlmtrain check-model` runs only the plan, on a login node, in seconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/state/safetensors.h"
#include "src/nn/module.h"

namespace vlm::model {

// One safetensors file of the snapshot.
struct SnapshotFile {
  std::string name;             // relative to the snapshot folder
  std::string error;            // why it could not be read: absent, a bad header ("" = read)
  io::SafetensorsHeader header; // when read; tensor data neither mapped nor read

  bool readable() const { return error.empty(); }
};

// Where a tensor is: files[file].header.tensors[index].
struct TensorPlace {
  size_t file = 0;
  size_t index = 0;
};

struct HfWeightPlan {
  std::vector<SnapshotFile> files;
  std::map<std::string, TensorPlace> tensors; // every tensor of the readable files, by name
  // The tensors the model does not compute with, as the loader treats them: kept raw (names with
  // a carried prefix, e.g. Qwen3.5's mtp.*) or dropped as transformers drops them (the stored head
  // of a tied model, legacy rotary_emb.inv_freq buffers).
  std::vector<std::string> carried, ignored;
  // Problems, one line each; any of them makes the snapshot unloadable.
  std::vector<std::string> file_problems; // index entries, missing / unreadable / truncated files
  std::vector<std::string> missing, unexpected, wrong;
  int64_t unchecked = 0; // parameters named only by files that could not be read

  const io::TensorInfo& info(const std::string& name) const; // a tensor's header entry
  size_t problem_count() const;
  // "<dir>: the snapshot's weights cannot be loaded into the <model> (counts):" and the problem
  // lines, file problems first, at most `max_lines` of them.
  std::string problems_message(const std::string& dir, const std::string& model,
                               size_t max_lines = SIZE_MAX) const;
};

// The plan of the snapshot in `dir` for the parameters `params` (declared shapes): its
// `model.safetensors.index.json` (whose weight_map names each tensor's file) if present, else
// `model.safetensors`; every file's header read and checked, and every tensor's bytes within its
// file. A folder without either file, or an index that is not valid, is an error; every other
// problem is collected in the plan. Each parameter must be stored with its declared shape in a
// float dtype (F32, BF16, F16, F64); a tensor the model lacks is unexpected unless carried (a
// float dtype required too) or ignored as above (a tied head: `params` has
// model.embed_tokens.weight and no lm_head.weight).
HfWeightPlan plan_hf_weights(const std::vector<nn::ParameterSpec>& params, const std::string& dir,
                             const std::vector<std::string>& carried_prefixes);

} // namespace vlm::model
