// Shared by the GPU tests: skip without a device, compare a CUDA result with the CPU one.
#pragma once

#include "src/core/device.h"
#include "tests/golden/golden.h"
#include "tests/skip.h"

namespace vlm::testing {

// Skips the test (exit 77) with the device query text when no CUDA device is visible.
inline void require_device() {
  if (cuda_device_count() == 0) VLM_SKIP(cuda_device_query().c_str());
}

// Max-norm relative error of a tensor on any device against another (rel_error: NaN/Inf-aware).
inline double rel_err(const Tensor& got, const Tensor& want) {
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  return rel_error(got, want);
}

} // namespace vlm::testing
