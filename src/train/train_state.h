// TrainState: everything a run needs to continue exactly where it stopped (DESIGN.md §4.1, §7),
// in one object, saved and loaded through io::StateWriter / io::StateReader
// (io/state/state_store.h; the HDF5 checkpoint implements them). A run restored from the state of
// step k trains steps k+1, ... bit-identically to the run that never stopped (CPU): the same
// parameters, AdamW moments and fp32 masters, the same LR (the schedule is a function of the step),
// and the same data (the loader resumes at the row after the last one trained on).
//
// Keys: model/<name> (each parameter), optim/<name>/{exp_avg, exp_avg_sq, master}, the model's
// stored dtypes and carried tensors (model/stored_tensors.h: stored_dtypes, carried/<name>), and
// the JSON document "state": {step, tokens, padded_tokens, skipped_steps, rng, optimizer step
// counts, the schedule it ran with, loaders: each data-parallel rank's loader state, in dp-rank
// order}.
//
// Resuming into another layout: tensors reshard (they are stored whole); the data position
// carries over only to the same number of data-parallel ranks (each rank reads its own share of
// the data, so another count partitions it differently): otherwise the loaders start the data
// over, with a warning. A parameter trained now that has no optimizer state in the state (frozen,
// or not trainable, when it was saved) starts with fresh AdamW moments and its master copied
// from the loaded value.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "io/loader/loader.h"
#include "io/state/state_store.h"
#include "model/causal_lm.h"
#include "parallel/param_layout.h"
#include "src/base/rng.h"
#include "src/optim/adamw.h"
#include "src/optim/lr_schedule.h"

namespace vlm::train {

struct TrainState {
  int64_t step = 0;          // optimizer steps done
  int64_t tokens = 0;        // real tokens trained on
  int64_t padded_tokens = 0; // padding tokens of the rows trained on
  int64_t skipped_steps = 0; // updates skipped for non-finite values (nan_policy = skip)
  Rng rng;                   // the run's random stream (weight init; later sampling)

  // Owned by the trainer; saved and loaded in place. The loader may be null (callers that feed
  // batches themselves): then no data position is saved, and none is restored.
  model::CausalLM* model = nullptr;
  optim::AdamW* optimizer = nullptr;
  const optim::LrSchedule* schedule = nullptr;
  io::DataLoader* loader = nullptr;
  // The data-parallel ranks, whose loader states are saved together (each rank's loader reads
  // its own share); null: this process is the only one.
  parallel::ProcessGroup* dp = nullptr;
  // The parameters this rank holds in part — FSDP shards, tensor-parallel parts, or both
  // (Parallelized::param_layouts()) — with their AdamW state; every other parameter is whole. The
  // state holds whole tensors either way (each rank writes and reads its own boxes of them), so
  // a state saved with one layout loads into any other. Saving and loading are then collective:
  // every rank calls them.
  std::map<std::string, parallel::ParamLayout> layouts;

  void save(io::StateWriter& out) const;
  // Overwrites the parameters, optimizer state and loader position of the objects above. The
  // whole state is checked first, and anything that does not fit is refused before anything
  // changes, naming the key: another LR schedule, a step past the schedule's end or below 0, a
  // malformed /state, a tensor missing, of another shape or dtype, or of a parameter this model
  // does not have (check()); a loader position of another data configuration (restore_loader).
  // An error while reading the tensors (a damaged file) leaves the objects partly overwritten
  // (build them anew).
  void load(const io::StateReader& in);

private:
  // The /state document `s` and every tensor's key, shape and dtype against this run's objects.
  void check(const io::StateReader& in, const nlohmann::json& s) const;
  // Restores this rank's loader from the saved ranks' states (see "Resuming" above).
  void restore_loader(const nlohmann::json& saved) const;
};

} // namespace vlm::train
