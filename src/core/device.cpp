#include "src/core/device.h"

#include "kernels/gpu_runtime.h"
#include "src/base/check.h"

namespace vlm {

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device::cuda(std::stoi(text.substr(5)));
  VLM_FAIL("unknown device '", text, "' (valid: cpu, cuda, cuda:N)");
}

bool cuda_built() {
#if VLM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// A CPU-only build links kernels/no_cuda.cpp: no device, and the query says why.
int cuda_device_count() { return kernels::cuda::device_count(); }

void check_device_available(Device device, const std::string& setting) {
  VLM_CHECK(device.is_cpu() || (device.index >= 0 && device.index < cuda_device_count()), setting,
            " = ", device.str(), " is not available: ", cuda_device_query());
}

double device_peak_tflops(Device device) {
  if (device.is_cuda() && device.index < cuda_device_count())
    return kernels::cuda::peak_bf16_tflops(device.index);
  return 0;
}

std::string cuda_device_query() { return kernels::cuda::device_query(); }

} // namespace vlm
