#include "src/train/train_step.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/attention_cudnn.h"
#include "kernels/optim.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"
#include "src/core/dispatch.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"
#include "src/optim/grad_clip.h"

namespace vlm::train {

optim::LrScheduleConfig lr_schedule_config(const TrainConfig& config) {
  const TrainingOptions& t = config.training;
  optim::LrScheduleConfig s;
  s.scheduler_type = t.scheduler_type;
  s.lr = 1.0; // a multiplier: each group's peak LR is its lr_scale
  s.warmup_steps = t.warmup_steps;
  s.total_steps = t.total_steps;
  s.min_lr_ratio = t.min_lr_ratio;
  s.wsd_decay_ratio = t.wsd_decay_ratio;
  s.wsd_decay = t.wsd_decay;
  return s;
}

namespace {

// What model.train_* and lr_* say for a parameter group.
struct GroupSettings {
  bool trained;
  double lr;
};

GroupSettings group_settings(const TrainConfig& c, model::ParamGroup g) {
  switch (g) {
  case model::ParamGroup::llm: return {c.model.train_llm, c.training.lr_llm};
  case model::ParamGroup::mlp: return {c.model.train_mlp, c.training.lr_mlp};
  case model::ParamGroup::vit: return {c.model.train_vit, c.training.lr_vit};
  }
  return {false, 0};
}

bool decays(const TrainingOptions& t, model::ParamKind kind) {
  switch (kind) {
  case model::ParamKind::weight: return true;
  case model::ParamKind::norm: return t.decay_norms;
  case model::ParamKind::bias: return t.decay_biases;
  case model::ParamKind::embedding: return t.decay_embeddings;
  }
  return true;
}

// The step's scalars, one f64 buffer on the losses' device, in the layout of
// kernels::cpu::step_guard: [0, m) the micro-batch loss sums, [m] the squared gradient norm,
// [m + 1] the clip coefficient, [m + 2] AdamW's skip flag (0: apply).
struct StepScalars {
  Tensor all;
  int64_t m = 0;
  Tensor norm_sq() const { return slice(all, 0, m, m + 1); }
  Tensor coef() const { return slice(all, 0, m + 1, m + 2); }
  Tensor skip() const { return slice(all, 0, m + 2, m + 3); }
};

// Packs the losses [m] and this rank's squared norm (clip_grad_norm_async's [2], anywhere).
StepScalars pack_step_scalars(const Tensor& losses, const Tensor& local_norm) {
  NoGradGuard no_grad;
  StepScalars s;
  s.m = losses.numel();
  s.all = Tensor::empty({s.m + 3}, DType::f64, losses.device());
  Tensor head = slice(s.all, 0, 0, s.m), norm_sq = s.norm_sq();
  copy_(head, losses);
  copy_(norm_sq, slice(local_norm, 0, 0, 1));
  return s;
}

// kernels::*::step_guard on the scalars, where they are.
void guard_step(StepScalars& s, double max_norm) {
  double* values = s.all.data<double>();
  dispatch_device(
      "step_guard", s.all.device(), [&] { kernels::cpu::step_guard(values, s.m, max_norm); },
      [&](auto stream) { kernels::cuda::step_guard(values, s.m, max_norm, stream); });
}

} // namespace

void apply_freezing(const TrainConfig& config, model::CausalLM& model) {
  for (const nn::ParameterSpec& p : model.parameter_specs()) // described or built
    if (!group_settings(config, model.param_role(p.name).group).trained)
      model.set_trainable(p.name, false);
}

TrainStepper::TrainStepper(const TrainConfig& config, std::shared_ptr<model::CausalLM> model,
                           const parallel::Parallelized& parallel)
    : config_(config), parallel_(&parallel), model_(std::move(model)),
      schedule_(lr_schedule_config(config)) {
  const TrainingOptions& t = config.training;
  loss_.vocab_chunk = t.loss_vocab_chunk;
  // The CUDA attention's backward algorithm and workspace bound (process-wide, as the kernels
  // are; kernels/attention_cudnn.h).
  kernels::cudnn_attention::Settings attention = kernels::cudnn_attention::settings();
  attention.deterministic = t.deterministic_attention;
  attention.workspace_limit = int64_t(t.attention_workspace_gb * double(int64_t(1) << 30));
  kernels::cudnn_attention::set_settings(attention);
  loss_.vocab_split = parallel_->loss_split();
  apply_freezing(config, *model_);
  // Groups in a fixed order: llm, llm_no_decay, mlp, mlp_no_decay, vit, vit_no_decay.
  std::vector<optim::ParamGroup> groups;
  for (auto g : {model::ParamGroup::llm, model::ParamGroup::mlp, model::ParamGroup::vit}) {
    const std::string name = model::param_group_name(g);
    const double lr = group_settings(config, g).lr;
    groups.push_back({name, {}, lr, t.weight_decay});
    groups.push_back({name + "_no_decay", {}, lr, 0.0});
  }
  for (const auto& p : model_->named_parameters()) {
    const model::ParamRole role = model_->param_role(p.name);
    Tensor param = p.tensor;
    if (!group_settings(config, role.group).trained) continue; // frozen by apply_freezing
    if (param.dtype() == DType::bf16) param.set_grad_dtype(t.grad_dtype);
    groups[2 * size_t(role.group) + (decays(t, role.kind) ? 0 : 1)].params.push_back(param);
  }
  std::erase_if(groups, [](const optim::ParamGroup& g) { return g.params.empty(); });
  VLM_CHECK(!groups.empty(), "config: model.train_llm = ", config.model.train_llm,
            ", train_mlp = ", config.model.train_mlp, ", train_vit = ", config.model.train_vit,
            " leave ", model_->summary(), " nothing to train");
  for (const auto& g : groups)
    trainable_.insert(trainable_.end(), g.params.begin(), g.params.end());
  norm_groups_ = parallel_->norm_groups(trainable_);
  optimizer_ = std::make_unique<optim::AdamW>(
      groups, optim::AdamWOptions{t.adam_beta1, t.adam_beta2, t.adam_eps});
}

std::string TrainStepper::first_non_finite(double loss) const {
  if (!std::isfinite(loss)) return "the loss (" + std::to_string(loss) + ")";
  for (const Tensor& p : trainable_)
    if (p.grad().defined() && !std::isfinite(optim::grad_norm({p})))
      return "the gradient of " + p.name();
  return "the gradient norm";
}

StepStats TrainStepper::step(int64_t step, const std::vector<model::Batch>& micro_batches) {
  VLM_CHECK(!micro_batches.empty(), "train step ", step + 1, ": no micro-batch");
  StepStats s;
  s.step = step;
  s.micro_batches = int64_t(micro_batches.size());
  for (const auto& b : micro_batches) s.targets += model::count_targets(b);
  s.targets = parallel_->sum_over_dp(s.targets);
  s.lr = schedule_.lr_at(step) * config_.training.lr_llm;
  if (s.targets == 0) { // nothing to learn from (every label masked): no update, not an error
    s.skipped = true;
    log_warn("train step ", step + 1, ": no trainable target in ", micro_batches.size(),
             " micro-batch(es); no update");
    return s;
  }

  const double scale = 1.0 / double(s.targets);
  // Each micro-batch's loss sum stays on the device, in one [micro-batches] tensor read once.
  Tensor losses;
  for (size_t i = 0; i < micro_batches.size(); i++) {
    parallel_->begin_micro_step(i == 0, i + 1 == micro_batches.size());
    Tensor l = model::lm_loss(*model_, micro_batches[i], Reduction::sum, loss_);
    if (!losses.defined())
      losses = Tensor::empty({int64_t(micro_batches.size())}, l.dtype(), l.device());
    {
      NoGradGuard no_grad;
      Tensor slot = slice(losses, 0, int64_t(i), int64_t(i) + 1);
      copy_(slot, reshape(l.detach(), {1}));
    }
    if (i == 0) trigger_fault(fault_, world_rank_, step + 1, FaultInjection::Point::step);
    affine(l, scale).backward();
    parallel_->end_micro_step();
  }
  parallel_->finish_gradients(*model_);
  // Everything up to the update is queued without a host read (on CUDA; on the CPU each call
  // simply runs): this rank's squared gradient norm (the multi-tensor kernels), summed over the
  // ranks that hold different parts of the gradients (replicas hold the same); the guard (clip
  // coefficient, skip flag) and, with data parallelism, the skip flag maxed over the ranks (a
  // non-finite loss on one rank skips the step everywhere, as the summed loss does); the clipping;
  // the AdamW update, which does nothing when the flag says skip.
  const double max_norm = config_.training.max_grad_norm;
  StepScalars scalars = pack_step_scalars(losses, parallel_->local_grad_norm_sq(norm_groups_));
  parallel_->sum_grad_norm_sq(scalars.norm_sq());
  guard_step(scalars, max_norm);
  parallel_->max_over_dp(scalars.skip());
  if (max_norm > 0) optim::scale_grads(trainable_, scalars.coef());
  optimizer_->step(schedule_.lr_at(step), scalars.skip());
  // The step's one host read (deferred behind the update): losses, norm and flag in one copy.
  const std::vector<double> v = scalars.all.to_doubles();
  const int64_t m = scalars.m;
  double loss_sum = 0;
  for (int64_t i = 0; i < m; i++) loss_sum += v[size_t(i)];
  loss_sum = parallel_->sum_over_dp(loss_sum);
  s.loss = loss_sum * scale;
  s.grad_norm = std::sqrt(v[size_t(m)]);
  // The flag, not the host values, says whether the update happened. It is non-zero exactly when
  // the summed loss or the norm is not finite (the same sums: only an overflow of finite
  // per-rank sums could tell them apart).
  if (v[size_t(m + 2)] != 0.0) {
    optimizer_->undo_step(); // the kernels changed nothing; the step counts go back
    std::string what = first_non_finite(s.loss); // reads the gradients: before zero_grad
    optimizer_->zero_grad();
    VLM_CHECK(config_.training.nan_policy == NanPolicy::skip, "train step ", step + 1,
              ": non-finite value in ", what, " (loss ", s.loss, ", grad norm ", s.grad_norm,
              "); training.nan_policy = \"skip\" skips such steps instead");
    s.skipped = true;
    skipped_++;
    log_warn("train step ", step + 1, ": non-finite value in ", what, "; update skipped (",
             skipped_, " so far)");
    VLM_CHECK(skipped_ <= config_.training.max_skipped_steps, "train step ", step + 1, ": ",
              skipped_,
              " updates skipped for non-finite values, more than "
              "training.max_skipped_steps = ",
              config_.training.max_skipped_steps);
    return s;
  }
  optimizer_->zero_grad();
  return s;
}

std::pair<double, int64_t> TrainStepper::evaluate(const std::vector<model::Batch>& batches) const {
  NoGradGuard no_grad;
  // The loss sums stay on the device until all batches ran: one read.
  std::vector<Tensor> sums;
  int64_t targets = 0;
  for (const auto& b : batches) {
    parallel_->begin_micro_step(false, false);
    sums.push_back(model::lm_loss(*model_, b, Reduction::sum, loss_).detach());
    parallel_->end_micro_step();
    targets += model::count_targets(b);
  }
  double loss_sum = 0;
  if (!sums.empty()) {
    Tensor all = Tensor::empty({int64_t(sums.size())}, DType::f64, sums[0].device());
    for (size_t i = 0; i < sums.size(); i++) {
      Tensor slot = slice(all, 0, int64_t(i), int64_t(i) + 1);
      copy_(slot, reshape(sums[i], {1}));
    }
    for (double l : all.to_doubles()) loss_sum += l;
  }
  return {loss_sum, targets};
}

} // namespace vlm::train
