// Learning-rate schedules with the reference trainer's config keys ([training] scheduler_type,
// warmup_steps, total_steps, min_lr_ratio, wsd_decay_ratio; docs/reference-trainer.md §1 #7-11,
// §2.3) and its two bugs fixed (§1 #8, §9 #15):
//   * warmup does not start at LR 0: step s < warmup_steps uses lr * (s + 1) / warmup_steps, so
//     the first update already moves the weights and the peak is reached at s = warmup_steps - 1;
//   * WSD decays to lr * min_lr_ratio (the reference ignored min_lr_ratio and went to 0), with a
//     linear decay by default (the reference used a cosine; WsdDecay::cosine keeps that shape).
//
// s is the 0-based index of the optimizer step about to be taken. After warmup, with
// r = min_lr_ratio and decay progress p = clamp((s - d0) / (total_steps - d0), 0, 1):
//   constant  lr
//   linear    d0 = warmup_steps;  lr * (r + (1 - r) * (1 - p))
//   cosine    d0 = warmup_steps;  lr * (r + (1 - r) * 0.5 * (1 + cos(pi * p)))   (= reference)
//   wsd       d0 = total_steps - floor(wsd_decay_ratio * total_steps); lr for s < d0, then
//             linear:  lr * (r + (1 - r) * (1 - p));  cosine: as the cosine schedule
// p reaches 1 at s = total_steps (as the reference's LambdaLR); later steps stay at lr * r.
#pragma once

#include <cstdint>
#include <string>

namespace vlm::optim {

enum class ScheduleType : uint8_t { constant, linear, cosine, wsd };
enum class WsdDecay : uint8_t { linear, cosine };

// Case-insensitive "constant" | "linear" | "cosine" | "wsd"; the error lists the valid names.
ScheduleType parse_schedule_type(const std::string& name);
const char* schedule_type_name(ScheduleType t);

struct LrScheduleConfig {
  ScheduleType scheduler_type = ScheduleType::wsd; // reference default "wsd"
  double lr = 1.0; // peak LR; 1.0 makes lr_at() a multiplier (per-group LRs via lr_scale)
  int64_t warmup_steps = 50;
  int64_t total_steps = 1000;
  double min_lr_ratio = 0.1;
  double wsd_decay_ratio = 0.1;
  WsdDecay wsd_decay = WsdDecay::linear;
};

class LrSchedule {
public:
  // Validates the config; errors name the offending key and value.
  explicit LrSchedule(const LrScheduleConfig& config);
  // The LR for optimizer step `step` (0-based). Stateless: resuming needs only the step.
  double lr_at(int64_t step) const;
  // lr_at(step) / config.lr.
  double factor_at(int64_t step) const;
  const LrScheduleConfig& config() const { return config_; }
  // First step of the decay phase (d0 above; warmup_steps for linear/cosine).
  int64_t decay_start() const { return decay_start_; }

private:
  LrScheduleConfig config_;
  int64_t decay_start_ = 0;
};

} // namespace vlm::optim
