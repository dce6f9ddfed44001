#include "src/core/device.h"

#if VLM_WITH_CUDA
#include "kernels/cuda_runtime.h"
#endif

namespace vlm {

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

bool cuda_built() {
#if VLM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if VLM_WITH_CUDA
  return kernels::cuda::device_count();
#else
  return 0;
#endif
}

std::string cuda_device_query() {
#if VLM_WITH_CUDA
  return kernels::cuda::device_query();
#else
  return "no CUDA device: this build has no CUDA backend (configure with -DVLM_CUDA=ON)";
#endif
}

} // namespace vlm
