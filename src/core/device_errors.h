// Deferred device-side checks: how a CUDA op validates indices and labels without synchronizing.
//
// The op registers what a failure would mean (a formatter for the message, given the bad value's
// position and value) and passes the returned site id to its kernel; a kernel that finds a bad
// value writes it to the device's error record (kernels/gpu_runtime.h) and skips the access. The
// host checks the record at its next synchronization with the device — every device-to-host
// read (Tensor::to(cpu), item, to_doubles) and every Stream/Event synchronize — and throws the
// registered message there, like PyTorch's device-side asserts but recoverable: the record is
// cleared and the process can go on. CPU ops keep checking immediately.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "src/core/device.h"

namespace vlm {

// The message of a failed check: (flat position of the bad value, the value) -> text.
using DeviceErrorFormatter = std::function<std::string(int64_t position, int64_t value)>;

// Registers a check about to be launched and returns its site id (> 0). The last 4096 sites are
// kept; a failure reported for an older one is described from the record's numbers alone.
int32_t register_device_check(DeviceErrorFormatter describe);

// Throws the vlm::Error of the first failure a kernel on `device` has reported since the last
// check (and clears it); returns at once when there is none (no CUDA call, no synchronization).
// The synchronization points above call it; call it after any other synchronization.
void check_device_errors(Device device);

// With VLM_SYNC=1 (kernels/gpu_runtime.h: every launch synchronizes) this is check_device_errors,
// so a bad index or label is thrown at the op that launched the check; otherwise it does nothing.
// dispatch() calls it after every CUDA op.
void check_device_errors_if_syncing(Device device);

} // namespace vlm
