// Devices: CPU or CUDA:n. The CUDA runtime is reached only through kernels/gpu_runtime.h, so
// this header and everything above it compile with a plain C++ compiler. Streams, events and the
// current device: src/core/stream.h.
#pragma once

#include <cstdint>
#include <string>

namespace vlm {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// "cpu", "cuda" (= cuda:0) or "cuda:N"; anything else throws naming the text.
Device parse_device(const std::string& text);

// Throws "<setting> = <device> is not available: <cuda_device_query()>" unless `device` is the
// CPU or a CUDA device this process can use; `setting` names where the device came from (a
// config key or a command-line option), so the message says what to change.
void check_device_available(Device device, const std::string& setting);

// True when this binary was built with the CUDA backend.
bool cuda_built();
// Number of usable CUDA devices; 0 when built without CUDA or when no device/driver is present.
int cuda_device_count();
// Dense bf16 peak TFLOP/s of a device, for MFU (kernels/gpu_runtime.h); 0 for the CPU or an
// unknown GPU.
double device_peak_tflops(Device device);
// A human-readable description: the devices, or "no CUDA device: <reason>".
std::string cuda_device_query();

} // namespace vlm
