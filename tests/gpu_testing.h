// Shared by the GPU tests: skip without a device, compare a CUDA result with the CPU one.
#pragma once

#include <cstring>

#include "src/core/device.h"
#include "tests/golden/golden.h"
#include "tests/skip.h"

namespace vlm::testing {

// Skips the test (exit 77) with the device query text when no CUDA device is visible.
inline void require_device() {
  if (cuda_device_count() == 0) VLM_SKIP(cuda_device_query().c_str());
}

inline const Device kGpu = Device::cuda(0);

// A detached copy of a (CPU) tensor on the GPU: the input of a GPU-vs-CPU comparison.
inline Tensor gpu(const Tensor& t) { return t.detach().to(kGpu); }

// Same dtype, shape and bytes, wherever the two tensors live.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// Max-norm relative error of a tensor on any device against another (rel_error: NaN/Inf-aware).
inline double rel_err(const Tensor& got, const Tensor& want) {
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  return rel_error(got, want);
}

} // namespace vlm::testing
