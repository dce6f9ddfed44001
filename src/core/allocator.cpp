#include "src/core/allocator.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
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

// Blocks are rounded up to a size class and kept on a free list per class when released. Classes
// are powers of two below 1 MiB and multiples of 1/8 of the enclosing power of two above, so at
// most ~12% is wasted. The cache is bounded; past the bound, freed blocks go back to the system.
class CpuAllocator final : public Allocator {
public:
  ~CpuAllocator() override { empty_cache(); }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t cls = size_class(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
      }
    }
    if (!p) p = std::aligned_alloc(64, cls);
    VLM_CHECK(p, "out of CPU memory allocating ", bytes, " bytes (in use: ", stats().current_bytes,
              " bytes)");
    record_alloc(bytes);
    return p;
  }

  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    record_free(bytes);
    size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + cls <= kMaxCached) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    std::free(p);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_ = 0;
  }
  size_t cached_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  Device device() const override { return Device::cpu(); }

private:
#if defined(__SANITIZE_ADDRESS__)
  static constexpr size_t kMaxCached = 0; // let AddressSanitizer see every use after free
#else
  static constexpr size_t kMaxCached = size_t(4) << 30;
#endif

  static size_t size_class(size_t bytes) {
    size_t pow2 = 64;
    while (pow2 < bytes) pow2 <<= 1;
    if (pow2 <= (size_t(1) << 20)) return pow2;
    size_t step = pow2 / 16; // the enclosing power is 2x the previous one: 8 classes per octave
    return (bytes + step - 1) / step * step;
  }

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
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

// Blocks of a power-of-two size class, each with the event recorded when it was last freed.
// Never emptied at exit: when statics are destroyed the CUDA runtime may be unloaded already.
class PinnedHostAllocator final : public Allocator {
public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t cls = size_class(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& blocks = free_[cls];
      for (size_t i = 0; i < blocks.size(); i++) {
        if (!kernels::cuda::event_done(blocks[i].event)) continue;
        p = blocks[i].ptr;
        events_[p] = blocks[i].event;
        blocks.erase(blocks.begin() + std::ptrdiff_t(i));
        cached_ -= cls;
        break;
      }
    }
    if (!p) p = kernels::cuda::host_alloc_pinned(cls);
    record_alloc(bytes);
    return p;
  }

  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    record_free(bytes);
    const size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    void*& event = events_[p];
    if (!event) event = kernels::cuda::event_create(false);
    kernels::cuda::event_record(event, nullptr);
    if (cached_ + cls > kMaxCached) { // over the bound: wait for the copies, then release
      kernels::cuda::event_synchronize(event);
      kernels::cuda::event_destroy(event);
      events_.erase(p);
      kernels::cuda::host_free_pinned(p);
      return;
    }
    free_[cls].push_back({p, event});
    events_.erase(p);
    cached_ += cls;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_)
      for (const Block& b : blocks) {
        kernels::cuda::event_synchronize(b.event);
        kernels::cuda::event_destroy(b.event);
        kernels::cuda::host_free_pinned(b.ptr);
      }
    free_.clear();
    cached_ = 0;
  }
  size_t cached_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  Device device() const override { return Device::cpu(); }

private:
  static constexpr size_t kMaxCached = size_t(2) << 30;
  static size_t size_class(size_t bytes) {
    size_t pow2 = 4096;
    while (pow2 < bytes) pow2 <<= 1;
    return pow2;
  }

  struct Block {
    void* ptr;
    void* event;
  };
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<Block>> free_;
  std::unordered_map<void*, void*> events_; // blocks in use -> their event (created at first free)
  size_t cached_ = 0;
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

Allocator& pinned_host_allocator() {
#if VLM_WITH_CUDA
  if (cuda_device_count() > 0) {
    static PinnedHostAllocator pinned;
    return pinned;
  }
#endif
  return allocator_for(Device::cpu());
}

} // namespace vlm
