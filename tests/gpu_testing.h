// Shared by the GPU tests: skip without a device, compare a CUDA result with the CPU one, poison
// the output buffers a test hands to a kernel, and know whether VLM_SYNC=1 is in force.
#pragma once

#include <cstring>
#include <limits>

#include "src/base/env.h"
#include "src/core/device.h"
#include "src/core/ops/elementwise.h"
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

// A floating-point tensor of `shape` on `device` (default: the GPU) filled with NaN: the output
// buffer a test hands to a kernel. An element the kernel fails to write stays NaN, and rel_err
// (NaN-aware) reports it, where an unpoisoned Tensor::empty would pass with whatever the
// stream-ordered pool left there — often the right answer from the previous, identical launch.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device = kGpu) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_(t, std::numeric_limits<double>::quiet_NaN());
  return t;
}
inline Tensor poisoned_like(const Tensor& like, Device device = kGpu) {
  return poisoned(like.shape(), like.dtype(), device);
}

// True under VLM_SYNC=1 (read as the runtime reads it, kernels/cuda/runtime.cu): every launch
// synchronizes and a deferred device error is thrown by the op that caused it, not at the next
// host read; a CUDA graph capture cannot run (the synchronization is illegal while capturing).
inline bool syncing() { return env_int("VLM_SYNC", 0) != 0; }

} // namespace vlm::testing
