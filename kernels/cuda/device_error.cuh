// The device side of the deferred error record (kernels/gpu_runtime.h): a launcher gets an
// ErrorReporter for the current device and passes it to its kernel by value; a thread that finds
// a bad value calls report(). For .cu files under kernels/cuda only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace vlm::kernels::cuda::dev {

// The fields in mapped pinned host memory: the host reads them after a synchronization without
// a copy. `flag` is written last, after a system-wide fence.
struct DeviceErrorFields {
  int32_t flag;
  int32_t site;
  int64_t position;
  int64_t value;
  int64_t limit;
};

struct ErrorReporter {
  unsigned int* claim = nullptr;       // device memory: 0 while the record is free
  DeviceErrorFields* fields = nullptr; // device pointer of the mapped host fields
  int32_t site = 0;

  // Records a failure unless one is already pending: the first report wins (the claim is a
  // device-memory atomic; atomics on host memory are not reliable over PCIe).
  __device__ void report(int64_t position, int64_t value, int64_t limit) const {
    if (atomicCAS(claim, 0u, 1u) != 0u) return;
    volatile DeviceErrorFields* f = fields;
    f->site = site;
    f->position = position;
    f->value = value;
    f->limit = limit;
    __threadfence_system(); // the fields are visible to the host before the flag
    f->flag = 1;
  }
};

// The reporter of the current device for `site` (creates the device's record on first use, which
// allocates: call it once before capturing a CUDA graph).
ErrorReporter error_reporter(int32_t site);

} // namespace vlm::kernels::cuda::dev
