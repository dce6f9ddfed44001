#include <catch2/catch.hpp>

#include <cmath>

#include "src/optim/lr_schedule.h"

using namespace vlm::optim;
using Catch::Matchers::Contains;

namespace {

LrSchedule make(ScheduleType type, double lr, int64_t warmup, int64_t total, double min_ratio,
                double wsd_ratio = 0.1, WsdDecay decay = WsdDecay::linear) {
  LrScheduleConfig c;
  c.scheduler_type = type;
  c.lr = lr;
  c.warmup_steps = warmup;
  c.total_steps = total;
  c.min_lr_ratio = min_ratio;
  c.wsd_decay_ratio = wsd_ratio;
  c.wsd_decay = decay;
  return LrSchedule(c);
}

} // namespace

// Expected values are worked out by hand from the formulas in lr_schedule.h.
TEST_CASE("lr schedule: warmup starts above zero and reaches the peak", "[optim]") {
  // The reference's warmup gave factor step/warmup, i.e. LR 0 for the first update.
  for (auto type :
       {ScheduleType::constant, ScheduleType::linear, ScheduleType::cosine, ScheduleType::wsd}) {
    INFO(schedule_type_name(type));
    auto s = make(type, 2.0, 4, 100, 0.1);
    CHECK(s.lr_at(0) == Approx(0.5).epsilon(1e-15));
    CHECK(s.lr_at(1) == Approx(1.0).epsilon(1e-15));
    CHECK(s.lr_at(2) == Approx(1.5).epsilon(1e-15));
    CHECK(s.lr_at(3) == 2.0);
    CHECK(s.lr_at(4) == 2.0); // decay progress 0
    CHECK(s.factor_at(0) == 0.25);
  }
}

TEST_CASE("lr schedule: constant", "[optim]") {
  auto s = make(ScheduleType::constant, 3e-4, 0, 10, 0.1);
  for (int64_t step : {0, 5, 9, 10, 1000}) CHECK(s.lr_at(step) == 3e-4);
}

TEST_CASE("lr schedule: linear decays to min_lr_ratio at total_steps", "[optim]") {
  auto s = make(ScheduleType::linear, 1.0, 0, 4, 0.0);
  CHECK(s.lr_at(0) == 1.0);
  CHECK(s.lr_at(1) == 0.75);
  CHECK(s.lr_at(2) == 0.5);
  CHECK(s.lr_at(3) == 0.25);
  CHECK(s.lr_at(4) == 0.0);
  auto w = make(ScheduleType::linear, 1.0, 2, 12, 0.2); // p = (s - 2) / 10
  CHECK(w.lr_at(7) == Approx(0.2 + 0.8 * 0.5).epsilon(1e-15));
  CHECK(w.lr_at(12) == Approx(0.2).epsilon(1e-15));
  CHECK(w.lr_at(50) == Approx(0.2).epsilon(1e-15));
}

TEST_CASE("lr schedule: cosine with a floor (the reference's formula)", "[optim]") {
  // warmup 2, total 10, r = 0.1, lr = 2: p = (s - 2) / 8.
  auto s = make(ScheduleType::cosine, 2.0, 2, 10, 0.1);
  CHECK(s.lr_at(2) == Approx(2.0).epsilon(1e-15));
  // p = 0.25: 0.1 + 0.9 * 0.5 * (1 + cos(pi/4)) = 0.1 + 0.45 * 1.7071067811865476
  CHECK(s.lr_at(4) == Approx(2.0 * 0.8681980515339464).epsilon(1e-14));
  CHECK(s.lr_at(6) == Approx(2.0 * 0.55).epsilon(1e-14)); // p = 0.5
  CHECK(s.lr_at(10) == Approx(0.2).epsilon(1e-14));       // p = 1
  CHECK(s.lr_at(1000) == Approx(0.2).epsilon(1e-14));
}

TEST_CASE("lr schedule: WSD is warmup, stable, then a decay to the floor", "[optim]") {
  // total 20, ratio 0.25: decay_steps = int(5.0) = 5, decay from step 15; r = 0.1.
  auto s = make(ScheduleType::wsd, 1.0, 2, 20, 0.1, 0.25);
  CHECK(s.decay_start() == 15);
  CHECK(s.lr_at(0) == 0.5);
  for (int64_t step = 1; step <= 15; step++) CHECK(s.lr_at(step) == 1.0);
  CHECK(s.lr_at(16) == Approx(0.1 + 0.9 * 0.8).epsilon(1e-15)); // p = 0.2, linear
  CHECK(s.lr_at(18) == Approx(0.1 + 0.9 * 0.4).epsilon(1e-15));
  CHECK(s.lr_at(20) == Approx(0.1).epsilon(1e-15));
  CHECK(s.lr_at(25) == Approx(0.1).epsilon(1e-15));
  // The reference's cosine shape, now to the floor: p = 0.4, cos(0.4 pi) = 0.30901699437494745.
  auto c = make(ScheduleType::wsd, 1.0, 2, 20, 0.1, 0.25, WsdDecay::cosine);
  CHECK(c.lr_at(17) == Approx(0.1 + 0.45 * 1.3090169943749475).epsilon(1e-14));
  // int(0.1 * 1000) = 100 decay steps with the reference defaults.
  CHECK(make(ScheduleType::wsd, 1.0, 50, 1000, 0.1, 0.1).decay_start() == 900);
  // A zero decay ratio keeps the peak to the end.
  auto flat = make(ScheduleType::wsd, 1.0, 0, 10, 0.1, 0.0);
  CHECK(flat.lr_at(9) == 1.0);
}

TEST_CASE("lr schedule: scheduler_type names parse case-insensitively", "[optim]") {
  CHECK(parse_schedule_type("WSD") == ScheduleType::wsd);
  CHECK(parse_schedule_type("Cosine") == ScheduleType::cosine);
  CHECK(parse_schedule_type("linear") == ScheduleType::linear);
  CHECK(parse_schedule_type("constant") == ScheduleType::constant);
  CHECK_THROWS_WITH(parse_schedule_type("step"),
                    Contains("'step'") && Contains("constant, linear, cosine, wsd"));
}

TEST_CASE("lr schedule: invalid configs name the key", "[optim]") {
  CHECK_THROWS_WITH(make(ScheduleType::cosine, 1.0, 20, 10, 0.1),
                    Contains("training.warmup_steps"));
  CHECK_THROWS_WITH(make(ScheduleType::cosine, 1.0, 0, 0, 0.1), Contains("training.total_steps"));
  CHECK_THROWS_WITH(make(ScheduleType::cosine, 1.0, 0, 10, 1.5), Contains("training.min_lr_ratio"));
  CHECK_THROWS_WITH(make(ScheduleType::wsd, 1.0, 0, 10, 0.1, -0.1),
                    Contains("training.wsd_decay_ratio"));
  CHECK_THROWS_WITH(make(ScheduleType::wsd, 1.0, 8, 10, 0.1, 0.5), Contains("exceed total_steps"));
  CHECK_THROWS_WITH(make(ScheduleType::constant, 1.0, 0, 10, 0.1).lr_at(-1), Contains("step"));
}
