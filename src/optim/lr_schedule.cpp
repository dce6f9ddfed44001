#include "src/optim/lr_schedule.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "src/base/check.h"

namespace vlm::optim {

ScheduleType parse_schedule_type(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (lower == "constant") return ScheduleType::constant;
  if (lower == "linear") return ScheduleType::linear;
  if (lower == "cosine") return ScheduleType::cosine;
  if (lower == "wsd") return ScheduleType::wsd;
  VLM_FAIL("training.scheduler_type: unknown schedule '", name,
           "'; valid: constant, linear, cosine, wsd");
}

const char* schedule_type_name(ScheduleType t) {
  switch (t) {
  case ScheduleType::constant: return "constant";
  case ScheduleType::linear: return "linear";
  case ScheduleType::cosine: return "cosine";
  case ScheduleType::wsd: return "wsd";
  }
  return "?";
}

LrSchedule::LrSchedule(const LrScheduleConfig& c) : config_(c) {
  VLM_CHECK(std::isfinite(c.lr) && c.lr >= 0, "LR schedule: lr must be finite and >= 0, got ",
            c.lr);
  VLM_CHECK(c.total_steps >= 1, "training.total_steps must be >= 1, got ", c.total_steps);
  VLM_CHECK(c.warmup_steps >= 0 && c.warmup_steps <= c.total_steps,
            "training.warmup_steps must be in [0, total_steps = ", c.total_steps, "], got ",
            c.warmup_steps);
  VLM_CHECK(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1,
            "training.min_lr_ratio must be in [0, 1], got ", c.min_lr_ratio);
  VLM_CHECK(c.wsd_decay_ratio >= 0 && c.wsd_decay_ratio <= 1,
            "training.wsd_decay_ratio must be in [0, 1], got ", c.wsd_decay_ratio);
  decay_start_ = c.warmup_steps;
  if (c.scheduler_type == ScheduleType::wsd) {
    // As the reference: decay_steps = int(wsd_decay_ratio * total_steps).
    const auto decay_steps = int64_t(std::floor(c.wsd_decay_ratio * double(c.total_steps)));
    decay_start_ = c.total_steps - decay_steps;
    VLM_CHECK(decay_start_ >= c.warmup_steps, "WSD schedule: warmup_steps (", c.warmup_steps,
              ") + decay steps (wsd_decay_ratio ", c.wsd_decay_ratio, " * total_steps ",
              c.total_steps, " = ", decay_steps, ") exceed total_steps");
  }
}

double LrSchedule::factor_at(int64_t step) const {
  VLM_CHECK(step >= 0, "LR schedule: step must be >= 0, got ", step);
  const auto& c = config_;
  if (step < c.warmup_steps) return double(step + 1) / double(c.warmup_steps);
  if (c.scheduler_type == ScheduleType::constant) return 1.0;
  if (step < decay_start_) return 1.0; // WSD stable phase
  const int64_t span = c.total_steps - decay_start_;
  const double p =
      span > 0 ? std::clamp(double(step - decay_start_) / double(span), 0.0, 1.0) : 1.0;
  const double r = c.min_lr_ratio;
  const bool cosine = c.scheduler_type == ScheduleType::cosine ||
                      (c.scheduler_type == ScheduleType::wsd && c.wsd_decay == WsdDecay::cosine);
  if (cosine) return r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * p));
  return r + (1.0 - r) * (1.0 - p);
}

double LrSchedule::lr_at(int64_t step) const { return config_.lr * factor_at(step); }

} // namespace vlm::optim
