// Resumable training checkpoints (`checkpoint.format = "hdf5"`; DESIGN.md §7): the folders in
// checkpoint.output_dir and how they are updated so that a crash never leaves a bad one behind.
//
//   step_000500/            a complete checkpoint:
//     state.h5              the TrainState (src/train/train_state.h) written collectively by every
//                           rank through parallel HDF5 (io/hdf5_state.h): /model/<hf name>,
//                           /optim/<hf name>/{exp_avg,exp_avg_sq,master}, /state, plus /config
//                           (the resolved training config) and /hf_config (the model's config.json)
//     config.toml           the resolved training config, for people
//     config.json, tokenizer files (+ preprocessor_config.json for a VLM): what `vlmtrain export`
//                           and `model.model_dir` need next to state.h5
//   step_000500.tmp/        a save in progress, or one a crash interrupted: never read; the next
//                           save removes it
//   latest -> step_000500   a symlink to the newest complete one, for scripts
//
// A save: rank 0 creates step_N.tmp/; every rank writes its rows of state.h5 and closes it (HDF5
// flushes), fsyncs what it wrote; a barrier; rank 0 writes the small files, renames step_N.tmp to
// step_N (atomic), fsyncs output_dir, points `latest` at it (a new link renamed over the old) and
// removes the oldest beyond checkpoint.keep_last. A crash at any point leaves the earlier
// checkpoints whole, and a folder is complete exactly when it is named step_N. An error on any
// rank (disk full, permission) is thrown there, and `vlmtrain` ends the whole job with it
// (src/main.cpp), so no rank trains on believing the state was saved.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "parallel/process_group.h"
#include "src/train/fault_injection.h"
#include "src/train/train_state.h"

namespace vlm::train {

// output_dir/step_000500 (at least 6 digits).
std::string checkpoint_step_dir(const std::string& output_dir, int64_t step);
// The checkpoint's HDF5 file: dir/state.h5.
std::string checkpoint_state_file(const std::string& dir);
// A complete checkpoint folder: named step_N and holding state.h5.
bool is_checkpoint_dir(const std::string& dir);
// The complete checkpoints in output_dir, oldest (lowest step) first.
std::vector<std::string> list_checkpoints(const std::string& output_dir);
// checkpoint.resume -> the folder to resume from. "latest": the newest complete checkpoint in
// output_dir, "" when there is none (a fresh start). A path: that checkpoint folder, or, for a
// folder of checkpoints (an output_dir, or its `latest` link), its newest; an error naming the
// path when it is neither.
std::string resolve_resume(const std::string& resume, const std::string& output_dir);

struct CheckpointSave {
  std::string output_dir;
  int64_t keep_last = 0;     // 0 = keep every checkpoint
  nlohmann::json config;     // the resolved training config (to_json), stored as /config
  std::string config_toml;   // the same as TOML (config.toml)
  nlohmann::json hf_config;  // the model's config.json, stored as /hf_config and config.json
  std::string tokenizer_dir; // its tokenizer files are copied next to state.h5 ("" = none)
  std::map<std::string, std::string> extra_files; // name -> contents (preprocessor_config.json)
  FaultInjection fault;                           // tests: a crash or error at a save point
};

// Saves `state` (its step) as output_dir/step_N, collectively over `world` (every rank of the
// job: MPI_COMM_WORLD). Returns the folder. Needs a build with parallel HDF5.
std::string save_checkpoint(const TrainState& state, const CheckpointSave& save,
                            parallel::ProcessGroup& world);

// Loads the checkpoint in `dir` into `state` (collective over every rank of the job), after
// checking that it was saved for the same model (`hf_config`) and parameter dtype: a checkpoint
// of another model, a missing or mis-shaped tensor, a truncated or foreign file is an error naming
// the folder and what differs. Returns the training config it was saved with.
nlohmann::json load_checkpoint(TrainState& state, const std::string& dir,
                               const nlohmann::json& hf_config, DType param_dtype);

// The /model tensors of a checkpoint folder's state.h5 into `model` (materialized here; each
// tensor converted to the parameter's dtype); one process. A tensor the model has and the file
// lacks, or of another shape, is an error naming it. For `model.model_dir` pointing at a
// checkpoint (training starts from its weights) and `vlmtrain export`.
void load_checkpoint_weights(model::CausalLM& model, const std::string& dir);

} // namespace vlm::train
