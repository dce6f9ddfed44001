#include "src/core/allocator.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "src/base/check.h"
#include "src/base/shape.h"

#if VLM_WITH_CUDA
#include "kernels/cuda_runtime.h"
#endif

namespace vlm {

void Allocator::record_alloc(size_t bytes) {
  size_t now = current_.fetch_add(bytes) + bytes;
  count_++;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void Allocator::record_free(size_t bytes) { current_.fetch_sub(bytes); }

namespace {

class CpuAllocator final : public Allocator {
public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + 63) / 64 * 64; // aligned_alloc needs a multiple of the alignment
    void* p = std::aligned_alloc(64, rounded);
    VLM_CHECK(p, "out of CPU memory allocating ", bytes, " bytes (in use: ", stats().current_bytes,
              " bytes)");
    record_alloc(bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    std::free(p);
    record_free(bytes);
  }
  Device device() const override { return Device::cpu(); }
};

#if VLM_WITH_CUDA
class CudaAsyncAllocator final : public Allocator {
public:
  explicit CudaAsyncAllocator(int index) : index_(index) {}
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    kernels::cuda::set_device(index_);
    void* p = kernels::cuda::malloc_async(bytes, nullptr);
    record_alloc(bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    kernels::cuda::set_device(index_);
    kernels::cuda::free_async(p, nullptr);
    record_free(bytes);
  }
  Device device() const override { return Device::cuda(index_); }

private:
  int index_;
};
#endif

} // namespace

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
#if VLM_WITH_CUDA
  static std::mutex mu;
  static std::vector<std::unique_ptr<Allocator>> cuda;
  std::lock_guard<std::mutex> lock(mu);
  VLM_CHECK(d.index >= 0 && d.index < cuda_device_count(), "device ", d.str(),
            " is not available: ", cuda_device_query());
  if (cuda.size() <= size_t(d.index)) cuda.resize(d.index + 1);
  if (!cuda[d.index]) cuda[d.index] = std::make_unique<CudaAsyncAllocator>(d.index);
  return *cuda[d.index];
#else
  VLM_FAIL("device ", d.str(), " requested but ", cuda_device_query());
#endif
}

} // namespace vlm
