// The folders of checkpoint.output_dir, and the rules for which run they belong to (DESIGN.md §7).
// An output_dir holds one run's line of checkpoints:
//
//   step_000500/            a complete checkpoint (src/train/checkpoint.h): named so only once
//                           state.h5 is complete; a step_N without state.h5 is damaged
//   step_000500.tmp/        a save in progress, or one a crash interrupted: never read
//   latest -> step_000500   the checkpoint the run goes on from: a save counts once `latest` names
//                           it (a crash between the rename and the link leaves the older one)
//   checkpoint-step-1000/   an HF snapshot (checkpoint.hf_snapshot; `vlmtrain generate`, export)
//   metrics.jsonl           logging.metrics_file by default
//   abandoned/after_step_000500/
//                           what a resume from step 500 left behind: the checkpoints and snapshots
//                           newer than step 500 (a branch this run no longer follows) and the
//                           metrics they had; moved, never deleted
//
// The rules (check_run_folder, resolve_resume, abandon_newer):
//   * a fresh run (checkpoint.resume = "") starts only in an output_dir that holds no run: any
//     checkpoint, snapshot, `latest`, abandoned/ or non-empty metrics file is an error naming it
//     (continue that run with resume = "latest", or choose another folder);
//   * resume = "latest" follows the `latest` link; without a link (a crash before the first one
//     was made) the newest complete step_N; with nothing at all, a fresh start. A link to a
//     missing or damaged folder, or damaged step_N folders without a link, are errors naming them:
//     a damaged checkpoint is never skipped in silence;
//   * resume = PATH takes that step_N, or resolves a folder of checkpoints as "latest" does; a
//     PATH outside output_dir needs an output_dir without a run (two runs never mix);
//   * resuming from step S while output_dir holds newer checkpoints moves those to abandoned/
//     and points `latest` at S (keep_last then never counts, and no save ever replaces, a
//     checkpoint of the abandoned branch);
//   * `latest` that is not a link (a folder, a file) is an error at start, not at the first save.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm::train {

// output_dir/step_000500 (at least 6 digits).
std::string checkpoint_step_dir(const std::string& output_dir, int64_t step);
// output_dir/checkpoint-step-500: the HF snapshot of a step.
std::string hf_snapshot_dir(const std::string& output_dir, int64_t step);
// The checkpoint's HDF5 file: dir/state.h5.
std::string checkpoint_state_file(const std::string& dir);
// The step of a folder named step_N or checkpoint-step-N (-1 for any other name).
int64_t checkpoint_step_of(const std::string& dir);
// A complete checkpoint folder: named step_N and holding state.h5.
bool is_checkpoint_dir(const std::string& dir);

// What an output_dir holds (each list oldest first).
struct CheckpointFolder {
  std::string dir;
  std::vector<std::string> complete;  // step_N with state.h5
  std::vector<std::string> damaged;   // step_N without state.h5
  std::vector<std::string> snapshots; // checkpoint-step-N
  std::string latest;                 // the folder `latest` names ("" without the link)
  bool latest_dangles = false;        // `latest` names a folder that is not there
  bool latest_not_link = false;       // a file or folder named `latest`
  bool abandoned = false;             // abandoned/ exists
  bool has_run() const;               // any of the above
  std::string describe() const;       // "step_000004, checkpoint-step-8, latest -> step_000004"
};
CheckpointFolder scan_checkpoint_folder(const std::string& output_dir);

// Start-of-run checks of output_dir (rank 0, before training): `latest` is a link or absent, and
// a fresh run (resume "") finds no earlier run there nor in `metrics_file`. Errors name the key,
// the folder and what it holds.
void check_run_folder(const std::string& output_dir, const std::string& resume,
                      const std::string& metrics_file);

// checkpoint.resume -> the step_N folder to resume from, or "" for a fresh start
// (resume "", or "latest" in an output_dir with no checkpoint yet). See the rules above.
std::string resolve_resume(const std::string& resume, const std::string& output_dir);

// A path given as a checkpoint to read from (`export --checkpoint`, `generate --model`): a step_N
// folder, an HF snapshot (config.json), or a folder of checkpoints (its `latest`, as resume =
// "latest"). `what` names the option in errors.
std::string resolve_checkpoint_path(const std::string& path, const std::string& what);

// `latest` -> dir (a folder in output_dir), replaced atomically (a new link renamed over the old).
void point_latest_at(const std::string& output_dir, const std::string& dir);
// checkpoint.keep_last: removes the oldest complete step_N beyond the newest `keep_last`, never
// what `latest` names; 0 keeps every one. Nothing else is ever deleted (HF snapshots stay).
void rotate_checkpoints(const std::string& output_dir, int64_t keep_last);

// After resuming from `resumed` (a step_N folder): the step_N and checkpoint-step-N folders of
// output_dir newer than it move to output_dir/abandoned/after_step_N[.k]/ with a copy of
// `metrics_file` (its lines past the resumed step would otherwise be cut), and `latest` names
// `resumed` when it is in output_dir. Returns the folder they went to ("" when nothing was newer).
// Rank 0, once every rank has loaded.
std::string abandon_newer(const std::string& output_dir, const std::string& resumed,
                          const std::string& metrics_file);

} // namespace vlm::train
