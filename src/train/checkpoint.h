// Resumable training checkpoints (`checkpoint.format = "hdf5"`, the default; DESIGN.md §7): what
// a step_N folder holds, how it is written so that a crash never leaves a bad one behind, and how
// it is read back with every part checked. The folders around it (latest, keep_last, which run
// an output_dir holds) are src/train/checkpoint_folder.h.
//
//   step_000500/            a complete checkpoint:
//     state.h5              the TrainState (src/train/train_state.h) written collectively by every
//                           rank through parallel HDF5 (io/state/hdf5_state.h): /model/<hf name>,
//                           /optim/<hf name>/{exp_avg,exp_avg_sq,master}, /state, plus /config
//                           (the resolved training config) and /hf_config (the model's config.json)
//     config.toml           the resolved training config, for people
//     config.json, tokenizer files (+ preprocessor_config.json for a VLM): what `vlmtrain export`,
//                           `generate`, `model.model_dir` and a resume need next to state.h5 (a
//                           resumed run reads this folder alone: src/train/trainer.h)
//
// A save: rank 0 creates step_N.tmp/; every rank writes its rows of state.h5 and closes it (HDF5
// flushes), fsyncs what it wrote; a barrier; rank 0 writes the small files, renames step_N.tmp to
// step_N (atomic; an existing step_N is never replaced), fsyncs output_dir, points `latest` at it
// and removes the oldest beyond checkpoint.keep_last. A crash at any point leaves the earlier
// checkpoints whole. An error on any rank (disk full, permission) is thrown there, and `vlmtrain`
// ends the whole job with it (src/main.cpp), so no rank trains on believing the state was saved.
//
// A read checks the whole checkpoint against the model before using any of it, on every path
// (resume on one rank or many, model.model_dir, export, generate): config.json and /hf_config
// against the model's config, every /model tensor there with the parameter's shape and a float
// dtype, no tensor the model lacks, every dataset's bytes inside the file (io/state/hdf5_state.h),
// and the /state document's fields in range (TrainState::load). Errors name the folder and the key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "parallel/comm/process_group.h"
#include "parallel/param_layout.h"
#include "src/train/checkpoint_folder.h"
#include "src/train/fault_injection.h"
#include "src/train/train_state.h"

namespace vlm::train {

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

// The /model tensors of a checkpoint folder's state.h5 into `model`, each converted to the
// parameter's dtype; every rank reads on its own (no collective). Checked first: /hf_config equals
// the model's config, every parameter's tensor is there with its declared (whole) shape and a float
// dtype, and the file holds no tensor the model lacks. Without `layouts` the model is materialized
// here and read whole (`vlmtrain export`, `generate`); with them (a parallelized model, allocated
// in its parts: training that starts from a checkpoint's weights, `model.model_dir`) each listed
// parameter reads only this rank's boxes, the others whole. A bf16 parameter whose stored value
// is more precise (an fp32 master of an F32 island) keeps that value whole in stored().exact.
void load_checkpoint_weights(model::CausalLM& model, const std::string& dir,
                             const std::map<std::string, parallel::ParamLayout>* layouts = nullptr);

// The model of a checkpoint to run or export: a step_N folder (built from its config.json, weights
// from state.h5) or an HF snapshot, in `dtype`. `path` is resolved by resolve_checkpoint_path
// (a folder of checkpoints: its `latest`); `what` names the option in errors.
std::shared_ptr<model::CausalLM> load_checkpoint_model(const std::string& path, DType dtype,
                                                       const std::string& what);

} // namespace vlm::train
