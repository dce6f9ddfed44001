// `vlmtrain train`: any registered model family (model/model_spec.h) trained on Energon data by a
// TOML config (src/train/config.h), as one process or as one rank of an MPI job (mpirun, srun).
// The trainer goes (DESIGN.md §4.1): checkpoint.resume resolved -> describe (a preset, the
// snapshot's config.json, or, resuming, the checkpoint's) -> freeze -> parallelize
// (parallel/parallelize.h: tensor parallelism, activation checkpointing, then FSDP when there are
// several data-parallel ranks — DDP and HSDP are its dp_shard = 1 and dp_replicate > 1 cases —
// each rank's parts allocated on the device) -> fill each rank's parts (a new run: drawn, or read
// from the HF snapshot by parts) -> TrainStepper (AdamW, masters seeded from the stored values) ->
// resume: parameters, masters, moments, RNG, schedule and loader position read by parts from the
// checkpoint's state.h5. A resumed run reads nothing else: no init, no byte of model.model_dir
// (its tokenizer comes from the checkpoint's copy too).
//
//   ranks      [parallel] gives the mesh (parallel/comm/mesh.h); each rank trains on one GPU picked
//   by
//              its node-local rank ("cuda" = cuda:local_rank), reads its own share of the data
//              (loader dp_rank / dp_world) and the step's loss and token counts are sums over
//              the data-parallel ranks. Rank 0 prints, writes metrics and checkpoints (the other
//              ranks print only their own skipped samples and errors, "[rank r/W]"). Evaluation
//              runs as many micro-batches on every rank (the fewest any rank has). A stop signal
//              on any rank stops every rank after the same step.
//
//   model      model.preset (a built-in config, random init) or an HF snapshot (model.model_dir),
//              weights loaded by name or HF-initialised (training.random_init)
//   data       the loader of data.train_split (io/loader/loader.h), micro_batch_rows packed rows
//   per
//              micro-step, tpi_multiplier micro-steps per optimizer step (accumulation_pattern);
//              each micro-batch is checked on the host (model::validate_batch) before upload
//   step       src/train/train_step.h (token-mean loss, clipping, AdamW, non-finite policy)
//   eval       every training.eval_steps steps and at the end: token-mean loss and perplexity
//              over eval_batches micro-batches of data.val_split, read from its beginning
//   state      src/train/train_state.h: step, tokens, RNG, model, optimizer, schedule, loader;
//              checkpoint.resume loads it from a step_N checkpoint (src/train/checkpoint.h) in
//              any rank layout before step 1
//   output     a progress line every logging.log_every steps (step/total, loss, lr, grad norm,
//              tokens/s, ETA); logging.metrics_file: one JSON object per optimizer step and per
//              evaluation; every save_steps and at total_steps a checkpoint in
//              checkpoint.output_dir: step_N/ (format hdf5: the whole state, every rank writing
//              its shards; src/train/checkpoint.h) or checkpoint-step-N/ (an HF snapshot gathered
//              to rank 0: config.json, model.safetensors, tokenizer files); a summary
//   bad data   the loader's skip report in the progress line when it changes, in every metrics
//              record and in the summary; above data.max_skip_fraction training stops with it
//              (src/train/skip_ceiling.h). output_dir is checked writable before step 1.
//   signals    SIGTERM / SIGUSR1 / SIGINT: stop after the running step with a checkpoint (run())
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "io/image/preprocess.h"
#include "model/causal_lm.h"
#include "parallel/comm/mesh.h"
#include "parallel/parallelize.h"
#include "src/train/config.h"
#include "src/train/metrics.h"
#include "src/train/train_state.h"

namespace vlm::train {

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0; // means over the first and the last logging window
  double eval_loss = -1;                // the last evaluation's loss; -1 when there was none
  double caption_accuracy = -1;         // training.caption_eval_images: in [0, 1]; -1 = not run
  int64_t real_tokens = 0, padded_tokens = 0;
  int64_t skipped_steps = 0;
  int64_t skipped_samples = 0; // by the training loader (its report: the end of the summary)
  double seconds = 0;
  std::string final_checkpoint; // folder of the last checkpoint written
  std::string hf_snapshot;      // folder of the last HF snapshot written (may be the same)
  int stop_signal = 0;          // SIGTERM / SIGUSR1 / SIGINT that stopped the run early, or 0
  int64_t peak_rss_bytes = 0;   // host memory: the largest peak resident set of any rank
};

class Trainer {
public:
  // Builds everything and checks what can fail early (device, tokenizer, data, val split).
  explicit Trainer(const TrainConfig& config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (its micro-batches, the update, metrics and progress), then the
  // evaluation and the checkpoint when they are due. Returns the step's record.
  StepRecord train_step();
  bool done() const;
  // train_step() until total_steps, then the summary. A SIGTERM, SIGUSR1 or SIGINT stops it after
  // the running step, with a message and a checkpoint (src/train/stop_signal.h).
  TrainSummary run();

  // The token-mean loss over the val split's first eval_batches micro-batches (logged).
  double evaluate();
  // The demo's caption accuracy (training.caption_eval_images; src/demo/caption_eval.h),
  // printed with a few examples and kept in the summary.
  void caption_accuracy();
  // The checkpoint of the current step: step_N/ (hdf5, collective; with checkpoint.hf_snapshot
  // also checkpoint-step-N/) or checkpoint-step-N/ (safetensors).
  void save_checkpoint();

  TrainState& state() { return state_; }
  const model::CausalLM& model() const { return *model_; }
  const TrainSummary& summary() const { return summary_; }
  const parallel::DeviceMesh& mesh() const { return *mesh_; }
  // A failure on purpose at a given step and rank (tests; `vlmtrain train --inject-fault`).
  void set_fault_injection(const FaultInjection& fault);

private:
  struct Data;
  // The image processor of the data config (min / max pixels).
  io::ImageProcessorConfig image_config() const;
  bool rank0() const { return mesh_->world().rank() == 0; }
  // The data-parallel group when there is more than one data-parallel rank, else null.
  parallel::ProcessGroup* dp_group() const;
  // Parameters, gradients and optimizer state on this rank against one process (logged).
  void log_memory() const;
  // checkpoint.resume: loads the checkpoint it names into the state, if any
  // (src/train/checkpoint.h), and moves a newer branch aside (src/train/checkpoint_folder.h).
  void resume();
  // The start's log lines (the run, the attention backend, what each rank holds) and, on CUDA, a
  // forward on a batch of the run's shape that builds every cuDNN attention plan before step 1.
  void announce_and_warm_up(const parallel::MeshShape& shape);
  // The HF snapshot output_dir/checkpoint-step-N of the current step (gathered tensor by tensor,
  // rank 0 writes); returns the folder.
  std::string save_hf_snapshot();
  // What the snapshot writes for parameter `name` (this rank's `param`): its fp32 master when it
  // is held less precisely than it was stored (an F32 tensor of a bf16 run;
  // model/stored_tensors.h), else the parameter.
  const Tensor& snapshot_source(const std::string& name, const Tensor& param) const;
  // The parts of train_step: the step's micro-batches (their tokens and FLOPs into rec; every
  // rank stops together when one's share of the data ended), the data counts (skips against the
  // ceiling; tokens and FLOPs summed over the data-parallel ranks), the progress line.
  std::vector<model::Batch> next_step_batches(int64_t step, StepRecord& rec);
  void count_step_data(StepRecord& rec);
  void log_progress(const StepRecord& rec);

  TrainConfig config_;
  std::unique_ptr<parallel::DeviceMesh> mesh_;
  Device device_;
  std::shared_ptr<model::CausalLM> model_;
  parallel::Parallelized parallel_; // after model_: undone while the model still lives
  std::unique_ptr<Data> data_;
  std::unique_ptr<TrainStepper> stepper_;
  TrainState state_;
  std::unique_ptr<MetricsLog> metrics_;
  ProgressWindow window_;
  TrainSummary summary_;
  double peak_tflops_ = 0;
  double start_seconds_ = 0, train_start_seconds_ = 0; // steady-clock seconds
  int64_t first_step_ = 0;                             // the step this process started at
  int64_t saved_step_ = -1;  // the step of the last checkpoint saved or resumed from
  std::string resumed_from_; // the checkpoint folder this run resumed from, or ""
  std::map<std::string, std::string> tokenizer_files_; // name -> contents (model_sources' folder)
  FaultInjection fault_;
};

// Trainer(config).run(), with an optional injected fault.
TrainSummary run_training(const TrainConfig& config, const FaultInjection& fault = {});

} // namespace vlm::train
