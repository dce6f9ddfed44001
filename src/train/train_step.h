// One optimizer step of any CausalLM, independent of where the batches come from (the loader in
// `vlmtrain train`, a fixed file in the loop-parity test):
//
//   N = Σ over the step's micro-batches of their valid targets
//   for each micro-batch b:  backward(loss_sum(b) / N)          (gradients accumulate)
//   grad_norm = global norm; clipped to max_grad_norm when > 0
//   AdamW at lr = schedule(step) × the group's peak LR; gradients dropped
//
// Dividing every micro-batch by the step's total target count makes the update that of the token
// mean over the whole step, whatever the micro-batch split — the reference divided each
// micro-batch mean by the micro-step count instead, which weights a short micro-batch's tokens
// more (reference-trainer.md §1 #12). The logged loss is the same token mean.
//
// On CUDA the step reads the device once, after the update is queued: the micro-batch losses stay
// on the device; the gradient norm is computed there by multi-tensor kernels (with FSDP this
// rank's shards, all-reduced over the shard group as a device tensor); a one-thread guard kernel
// (kernels/optim.h step_guard) derives the clip coefficient and a skip flag (the summed loss or
// the norm is not finite; with data parallelism maxed over the ranks); the gradients are clipped
// by the device coefficient and AdamW is launched with the flag, so its kernels change nothing on
// a non-finite step. Then losses, norm and flag come back in one copy. The host applies
// training.nan_policy afterwards: a skipped step's parameters and moments are untouched (the
// flag) and AdamW's host-side step counts are taken back (AdamW::undo_step), so the next update
// uses the right bias correction and a checkpoint holds only applied updates. So the host queues
// the whole step without waiting for the backward pass to drain.
//
// Parameter groups (AdamW): by the model's param_role, the language model at lr_llm, the
// vision-language merger at lr_mlp and the vision tower at lr_vit, each split into decay and
// no-decay (norms, biases, embeddings unless training.decay_* say otherwise): "llm",
// "llm_no_decay", "mlp", ... Frozen groups (model.train_* = false) get requires_grad = false and
// no optimizer state. Gradients of bf16 parameters accumulate in training.grad_dtype (f32 by
// default, as PyTorch AMP and FSDP2 mixed precision do); AdamW reads them as they are.
//
// Non-finite loss or gradient norm (training.nan_policy): abort throws naming the step and the
// first non-finite tensor (the loss, or a parameter gradient by its HF name) with the weights and
// optimizer state as they were before the step; skip drops the gradients, applies no update,
// counts the step, and throws once more than max_skipped_steps were skipped.
//
// Parallelism: the stepper talks to the one object parallelize() returns
// (parallel/parallelize.h, its step protocol) and names no kind of parallelism. Every rank runs
// the same micro-step count on its own micro-batches; N, the logged loss and the skip decisions
// are sums over the data-parallel ranks, so the update is the token mean over the global batch,
// exactly as one process would compute it. Each micro-batch is wrapped (FSDP's gathers and
// reductions), the gradients finished after the last (tensor parallelism's partial sums), the
// norm weighted by placement and summed over the ranks holding different parts, on the device;
// the loss takes the protocol's combine hook (a vocabulary-parallel head).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/lm_loss.h"
#include "parallel/parallelize.h"
#include "src/optim/adamw.h"
#include "src/optim/lr_schedule.h"
#include "src/train/config.h"
#include "src/train/fault_injection.h"

namespace vlm::train {

struct StepStats {
  int64_t step = 0;          // 0-based index of the optimizer step
  double loss = 0;           // token-mean loss over the step's micro-batches
  double grad_norm = 0;      // before clipping
  double lr = 0;             // LR of the language model group
  int64_t targets = 0;       // tokens the loss was computed on
  int64_t micro_batches = 0; // micro-steps
  bool skipped = false;      // non-finite, nan_policy = skip
};

// Freezes (requires_grad = false) the parameter groups model.train_* turns off. The trainer calls
// it before FSDP shards the model (frozen parameters are not sharded); TrainStepper calls it too.
void apply_freezing(const TrainConfig& config, model::CausalLM& model);

class TrainStepper {
public:
  // Builds the optimizer groups and state for `model` (its parameters must be allocated; with
  // FSDP, its shards).
  TrainStepper(const TrainConfig& config, std::shared_ptr<model::CausalLM> model,
               const parallel::Parallelized& parallel = parallel::Parallelized::none());

  // Runs optimizer step `step` (0-based) over `micro_batches` (at least one).
  StepStats step(int64_t step, const std::vector<model::Batch>& micro_batches);

  // Token-mean loss over batches, no gradients (evaluation): {loss_sum, targets} of this rank's
  // batches (the caller sums them over ranks).
  std::pair<double, int64_t> evaluate(const std::vector<model::Batch>& batches) const;

  optim::AdamW& optimizer() { return *optimizer_; }
  const optim::LrSchedule& schedule() const { return schedule_; }
  // Trainable parameters in optimizer order.
  const std::vector<Tensor>& trainable() const { return trainable_; }
  int64_t skipped_steps() const { return skipped_; }
  void set_skipped_steps(int64_t n) { skipped_ = n; } // restoring a TrainState
  model::CausalLM& model() const { return *model_; }
  void set_fault_injection(const FaultInjection& fault, int world_rank) {
    fault_ = fault;
    world_rank_ = world_rank;
  }

private:
  // "the loss" or "the gradient of <name>": the first non-finite value of this step.
  std::string first_non_finite(double loss) const;

  TrainConfig config_;
  const parallel::Parallelized* parallel_; // the step protocol (must outlive the stepper)
  FaultInjection fault_;
  int world_rank_ = 0;
  std::shared_ptr<model::CausalLM> model_;
  model::LossOptions loss_;
  std::unique_ptr<optim::AdamW> optimizer_;
  optim::LrSchedule schedule_;
  std::vector<Tensor> trainable_;
  parallel::Parallelized::NormGroups norm_groups_; // trainable_ by gradient-norm weight
  int64_t skipped_ = 0;
};

// The LR schedule of a config (lr = 1: a multiplier of each group's peak LR).
optim::LrScheduleConfig lr_schedule_config(const TrainConfig& config);

} // namespace vlm::train
