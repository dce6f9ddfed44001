// A bitwise snapshot of what an optimizer step may change — every trainable parameter's value and
// its AdamW state (moments, master, step count) — for the tests of skipped steps
// (tests/train/test_nan_skip.cpp, test_step_guard_mpi.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "src/train/train_step.h"

namespace vlm::testing {

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

struct StepSnapshot {
  std::vector<std::string> names;
  std::vector<Tensor> tensors; // per parameter: value, exp_avg, exp_avg_sq[, master]
  std::vector<int64_t> steps;
};

inline StepSnapshot step_snapshot(train::TrainStepper& stepper) {
  StepSnapshot s;
  for (const Tensor& p : stepper.trainable()) {
    const optim::AdamWState& st = stepper.optimizer().state(p.name());
    s.names.push_back(p.name());
    s.tensors.push_back(p.detach().clone());
    s.tensors.push_back(st.exp_avg.clone());
    s.tensors.push_back(st.exp_avg_sq.clone());
    if (st.master.defined()) s.tensors.push_back(st.master.clone());
    s.steps.push_back(st.step);
  }
  return s;
}

inline void check_same(const StepSnapshot& got, const StepSnapshot& want) {
  REQUIRE(got.names == want.names);
  REQUIRE(got.tensors.size() == want.tensors.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.tensors.size(); i++)
    if (!same_bytes(got.tensors[i], want.tensors[i])) differ++;
  CHECK(differ == 0);
  CHECK(got.steps == want.steps);
}

} // namespace vlm::testing
