// The deferred device error record (kernels/gpu_runtime.h, kernels/cuda/device_error.cuh): per
// device, a claim word in device memory and the fields in mapped pinned host memory, created on
// first use and never freed (static destructors may run after the CUDA runtime is gone).
#include <atomic>
#include <mutex>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device_error.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct Record {
  unsigned int* claim = nullptr;
  dev::DeviceErrorFields* host = nullptr;   // host view
  dev::DeviceErrorFields* device = nullptr; // the same memory as the device sees it
};

std::atomic<Record*> g_records[kMaxDevices];
std::mutex g_mutex; // creation and clearing

// Sets the current device for a scope (the runtime layer has no vlm::DeviceGuard).
struct ScopedDevice {
  int prev = -1;
  explicit ScopedDevice(int device) {
    VLM_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) VLM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~ScopedDevice() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev) cudaSetDevice(prev);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
};

Record* record_for(int device) {
  VLM_CHECK(device >= 0 && device < kMaxDevices, "device error record: device ", device,
            " out of range [0, ", kMaxDevices, ")");
  if (Record* r = g_records[device].load(std::memory_order_acquire)) return r;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (Record* r = g_records[device].load(std::memory_order_acquire)) return r;
  ScopedDevice on(device);
  auto* r = new Record();
  VLM_CUDA_CHECK(cudaMalloc(&r->claim, sizeof(unsigned int)));
  VLM_CUDA_CHECK(cudaMemset(r->claim, 0, sizeof(unsigned int)));
  VLM_CUDA_CHECK(cudaHostAlloc(&r->host, sizeof(dev::DeviceErrorFields),
                               cudaHostAllocMapped | cudaHostAllocPortable));
  *r->host = dev::DeviceErrorFields{};
  VLM_CUDA_CHECK(cudaHostGetDevicePointer(&r->device, r->host, 0));
  VLM_CUDA_CHECK(cudaDeviceSynchronize()); // the claim's memset is done before any kernel uses it
  g_records[device].store(r, std::memory_order_release);
  return r;
}

} // namespace

dev::ErrorReporter dev::error_reporter(int32_t site) {
  int device = 0;
  VLM_CUDA_CHECK(cudaGetDevice(&device));
  const Record* r = record_for(device);
  return ErrorReporter{r->claim, r->device, site};
}

bool take_device_error(int device, DeviceError* error) {
  if (device < 0 || device >= kMaxDevices) return false;
  Record* r = g_records[device].load(std::memory_order_acquire);
  if (!r) return false; // no kernel of this device ever got a reporter
  volatile dev::DeviceErrorFields* f = r->host;
  if (f->flag == 0) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (f->flag == 0) return false; // another thread took it
  std::atomic_thread_fence(std::memory_order_acquire);
  error->site = f->site;
  error->position = f->position;
  error->value = f->value;
  error->limit = f->limit;
  f->flag = 0;
  // Reopen the claim (a synchronous copy: this is the error path).
  ScopedDevice on(device);
  const unsigned int zero = 0;
  VLM_CUDA_CHECK(cudaMemcpy(r->claim, &zero, sizeof zero, cudaMemcpyHostToDevice));
  return true;
}

} // namespace vlm::kernels::cuda
