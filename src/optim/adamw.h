// AdamW with decoupled weight decay (torch.optim.AdamW semantics, amsgrad off):
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// State is fp32 (f64 for f64 parameters): exp_avg, exp_avg_sq, and for bf16 parameters an fp32
// master copy that receives the update and is rounded (nearest-even) into the bf16 parameter —
// the reference trainer kept everything in bf16 (docs/reference-trainer.md §1 #14, §9 #4).
//
// Parameter groups carry their own LR multiplier and weight decay, which is how the trainer
// expresses per-module LRs (lr_llm / lr_mlp / lr_vit) and "no decay for norms, biases,
// embeddings". The state is keyed by parameter name (Tensor::name()) for checkpoints.
// CUDA parameters (f32 or bf16; state on the parameter's device) are updated by one multi-tensor
// launch per (device, parameter dtype, gradient dtype), bit-identical to the CPU update.
//
// Deferred skip (the training step's nan_policy): step(lr, skip) takes a one-element f64 tensor
// whose value is known only on the device when the update is queued; the update kernels leave
// every parameter, master and moment untouched when it is nonzero. The step counts (host-side, for
// the bias corrections) advance either way; once the host has read the flag, undo_step() returns
// them, so the next applied update uses the right t and a checkpoint holds the counts of the
// updates really applied.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "src/core/tensor.h"

namespace vlm::optim {

struct ParamGroup {
  std::string name;           // for messages ("llm", "mlp", "no_decay")
  std::vector<Tensor> params; // named leaves that require grad (f32, bf16 or f64, contiguous)
  double lr_scale = 1.0;      // this group's LR = the LR passed to step() * lr_scale
  double weight_decay = 0.0;  // decoupled weight decay coefficient
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8; // training.eps (the reference defined it but never passed it)
};

struct AdamWState {
  Tensor exp_avg;    // first moment, f32 (f64 for f64 parameters), parameter shape
  Tensor exp_avg_sq; // second moment, same dtype
  Tensor master;     // f32 copy of a bf16 parameter; undefined for f32/f64 parameters
  int64_t step = 0;  // updates applied to this parameter (its bias-correction count)
};

class AdamW {
public:
  // Allocates all state now (moments zero, masters copied from the parameters' current values).
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});

  // One update of every parameter that has a .grad, with LR lr * group.lr_scale. Parameters
  // without a gradient are skipped and keep their step count (as torch does). Gradients must be
  // the parameter's dtype, or f32 for a bf16 parameter.
  // skip (optional): a one-element f64 tensor on any device; nonzero: no parameter, master or
  // moment changes (read by the kernels on the device, or on the host for CPU parameters; a flag
  // on another device than a parameter is copied there first, a read for CPU parameters).
  void step(double lr, const Tensor& skip = Tensor());
  // After step(lr, skip) with a nonzero skip: the step counts that call advanced go back (nothing
  // else changed). Calling it twice, or without a step before, does nothing.
  void undo_step();
  // Drops every parameter's .grad.
  void zero_grad();
  // After parameter values are overwritten outside the optimizer (e.g. weights loaded after the
  // optimizer was built), copies them into the fp32 masters so the next step starts from them.
  void refresh_master();

  const std::vector<ParamGroup>& groups() const { return groups_; }
  const AdamWOptions& options() const { return options_; }
  // Names in group order (checkpoint writers iterate this).
  std::vector<std::string> param_names() const;
  bool has_state(const std::string& param_name) const;
  AdamWState& state(const std::string& param_name);
  const AdamWState& state(const std::string& param_name) const;

private:
  std::vector<ParamGroup> groups_;
  AdamWOptions options_;
  std::map<std::string, AdamWState> state_;
  std::vector<AdamWState*> last_advanced_; // the states whose step count the last step() advanced
};

} // namespace vlm::optim
