#include "src/train/train_step.h"

#include <cmath>

#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
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

TrainStepper::TrainStepper(const TrainConfig& config,
                           std::shared_ptr<model::Qwen3ForCausalLM> model)
    : config_(config), model_(std::move(model)), schedule_(lr_schedule_config(config)) {
  const TrainingOptions& t = config.training;
  forward_.loss_vocab_chunk = t.loss_vocab_chunk;
  forward_.ac = t.ac_mode == AcMode::full        ? model::ActivationCheckpointing::full
                : t.ac_mode == AcMode::selective ? model::ActivationCheckpointing::selective
                                                 : model::ActivationCheckpointing::off;
  // A text model is all language model: train_llm decides for every parameter.
  VLM_CHECK(config.model.train_llm,
            "config: model.train_llm = false leaves a text-only model nothing to train");
  optim::ParamGroup decay{"llm", {}, t.lr_llm, t.weight_decay};
  optim::ParamGroup no_decay{"llm_no_decay", {}, t.lr_llm, 0.0};
  for (const auto& p : model_->named_parameters()) {
    const model::ParamKind kind = model::qwen3_param_kind(p.name);
    const bool decays = kind == model::ParamKind::weight ||
                        (kind == model::ParamKind::norm && t.decay_norms) ||
                        (kind == model::ParamKind::bias && t.decay_biases) ||
                        (kind == model::ParamKind::embedding && t.decay_embeddings);
    (decays ? decay : no_decay).params.push_back(p.tensor);
  }
  std::vector<optim::ParamGroup> groups;
  for (auto* g : {&decay, &no_decay})
    if (!g->params.empty()) groups.push_back(*g);
  for (const auto& g : groups)
    trainable_.insert(trainable_.end(), g.params.begin(), g.params.end());
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

StepStats TrainStepper::step(int64_t step, const std::vector<model::TextBatch>& micro_batches) {
  VLM_CHECK(!micro_batches.empty(), "train step ", step + 1, ": no micro-batch");
  StepStats s;
  s.step = step;
  s.micro_batches = int64_t(micro_batches.size());
  for (const auto& b : micro_batches) s.targets += model::count_targets(b);
  s.lr = schedule_.lr_at(step) * config_.training.lr_llm;
  if (s.targets == 0) { // nothing to learn from (every label masked): no update, not an error
    s.skipped = true;
    log_warn("train step ", step + 1, ": no trainable target in ", micro_batches.size(),
             " micro-batch(es); no update");
    return s;
  }

  const double scale = 1.0 / double(s.targets);
  double loss_sum = 0;
  for (const auto& b : micro_batches) {
    Tensor l = model_->loss_sum(b, forward_);
    loss_sum += l.item();
    affine(l, scale).backward();
  }
  s.loss = loss_sum * scale;

  const double max_norm = config_.training.max_grad_norm;
  s.grad_norm =
      max_norm > 0 ? optim::clip_grad_norm(trainable_, max_norm) : optim::grad_norm(trainable_);
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm)) {
    std::string what = first_non_finite(s.loss);
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
  optimizer_->step(schedule_.lr_at(step));
  optimizer_->zero_grad();
  return s;
}

std::pair<double, int64_t>
TrainStepper::evaluate(const std::vector<model::TextBatch>& batches) const {
  NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t targets = 0;
  for (const auto& b : batches) {
    loss_sum += model_->loss_sum(b, forward_).item();
    targets += model::count_targets(b);
  }
  return {loss_sum, targets};
}

} // namespace vlm::train
