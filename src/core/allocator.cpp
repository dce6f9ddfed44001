#include "src/core/allocator.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "src/base/check.h"
#include "src/base/shape.h"

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

// The smallest power of two >= bytes, and at least `min` (a power of two).
size_t pow2_class(size_t bytes, size_t min) {
  size_t pow2 = min;
  while (pow2 < bytes) pow2 <<= 1;
  return pow2;
}

// What the two caching host allocators share: freed blocks (Block) kept on a free list per size
// class under one lock, the cached byte count, and emptying the cache. Host memory: device CPU.
template <typename Block> class HostBlockCache : public Allocator {
public:
  size_t cached_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  Device device() const override { return Device::cpu(); }

protected:
  // Gives every cached block to release(block) and forgets them all.
  template <typename Release> void release_cached(Release&& release) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_)
      for (const Block& b : blocks) release(b);
    free_.clear();
    cached_ = 0;
  }

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<Block>> free_; // size class -> cached blocks
  size_t cached_ = 0;                                   // bytes in free_
};

// Blocks are rounded up to a size class and kept on a free list per class when released. Classes
// are powers of two below 1 MiB and multiples of 1/8 of the enclosing power of two above, so at
// most ~12% is wasted. The cache is bounded; past the bound, freed blocks go back to the system.
class CpuAllocator final : public HostBlockCache<void*> {
public:
  ~CpuAllocator() override { empty_cache(); }

  void* allocate(size_t bytes, const Stream&) override {
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

  void deallocate(void* p, size_t bytes, const Stream&) override {
    if (!p) return;
    record_free(bytes);
    size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cls <= kMaxCachedBlock && cached_ + cls <= kMaxCached) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    std::free(p);
  }

  void empty_cache() override {
    release_cached([](void* p) { std::free(p); });
  }

private:
#if defined(__SANITIZE_ADDRESS__)
  static constexpr size_t kMaxCached = 0; // let AddressSanitizer see every use after free
#else
  static constexpr size_t kMaxCached = size_t(256) << 20;
#endif
  // Larger blocks go back to the system at once: a cached one is resident memory that only a
  // request of the same size class reuses (measured: +1.6 GiB of peak RSS over the live tensors
  // of a Qwen3-0.6B FSDP rank with a 4 GiB cache), and the work done on such a tensor dwarfs
  // the page faults of allocating it again.
  static constexpr size_t kMaxCachedBlock = size_t(64) << 20;

  static size_t size_class(size_t bytes) {
    const size_t pow2 = pow2_class(bytes, 64);
    if (pow2 <= (size_t(1) << 20)) return pow2;
    size_t step = pow2 / 16; // the enclosing power is 2x the previous one: 8 classes per octave
    return (bytes + step - 1) / step * step;
  }
};

// cudaMallocAsync / cudaFreeAsync on the given stream under a DeviceGuard, so the block comes from
// this device's pool whatever device the caller has current, and the caller's device is kept.
class CudaAsyncAllocator final : public Allocator {
public:
  explicit CudaAsyncAllocator(int index) : index_(index) {}
  void* allocate(size_t bytes, const Stream& stream) override {
    if (bytes == 0) return nullptr;
    check_stream(stream);
    DeviceGuard on(device());
    void* p = kernels::cuda::malloc_async(bytes, stream.handle());
    record_alloc(bytes);
    return p;
  }
  void deallocate(void* p, size_t bytes, const Stream& stream) override {
    if (!p) return;
    DeviceGuard on(device());
    kernels::cuda::free_async(p, stream.handle());
    record_free(bytes);
  }
  Device device() const override { return Device::cuda(index_); }

private:
  void check_stream(const Stream& s) const {
    VLM_CHECK(s.device() == device(), "allocator of ", device().str(), ": a stream of ",
              s.device().str(), " cannot order its blocks");
  }
  int index_;
};

// A CUDA event and the device it was created on (an event is recorded on that device's streams
// only).
struct BlockEvent {
  void* handle = nullptr;
  int device = -1;
};
// A cached pinned block and the event recorded when it was last freed.
struct PinnedBlock {
  void* ptr;
  BlockEvent event;
};

// Blocks of a power-of-two size class, each with the event recorded when it was last freed (on the
// current stream of the current device, where the copies out of it were queued). Never emptied at
// exit: when statics are destroyed the CUDA runtime may be unloaded already.
class PinnedHostAllocator final : public HostBlockCache<PinnedBlock> {
public:
  void* allocate(size_t bytes, const Stream&) override {
    if (bytes == 0) return nullptr;
    const size_t cls = size_class(bytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& blocks = free_[cls];
      for (size_t i = 0; i < blocks.size(); i++) {
        if (!done(blocks[i].event)) continue;
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

  void deallocate(void* p, size_t bytes, const Stream&) override {
    if (!p) return;
    record_free(bytes);
    const size_t cls = size_class(bytes);
    const Device d = Device::cuda(kernels::cuda::current_device());
    const Stream stream = current_stream(d);
    std::lock_guard<std::mutex> lock(mu_);
    BlockEvent& event = events_[p];
    if (event.handle && event.device != d.index) { // done (the block was handed out): re-create
      destroy(event);
      event = {};
    }
    if (!event.handle) event = {kernels::cuda::event_create(false), d.index};
    kernels::cuda::event_record(event.handle, stream.handle());
    if (cached_ + cls > kMaxCached) { // over the bound: wait for the copies, then release
      kernels::cuda::event_synchronize(event.handle);
      destroy(event);
      events_.erase(p);
      kernels::cuda::host_free_pinned(p);
      return;
    }
    free_[cls].push_back({p, event});
    events_.erase(p);
    cached_ += cls;
  }

  void empty_cache() override {
    release_cached([](const PinnedBlock& b) {
      kernels::cuda::event_synchronize(b.event.handle);
      destroy(b.event);
      kernels::cuda::host_free_pinned(b.ptr);
    });
  }

private:
  static constexpr size_t kMaxCached = size_t(2) << 30;
  static size_t size_class(size_t bytes) { return pow2_class(bytes, 4096); }

  static bool done(const BlockEvent& e) {
    DeviceGuard on(Device::cuda(e.device));
    return kernels::cuda::event_done(e.handle);
  }
  static void destroy(const BlockEvent& e) {
    DeviceGuard on(Device::cuda(e.device));
    kernels::cuda::event_destroy(e.handle);
  }
  std::unordered_map<void*, BlockEvent>
      events_; // blocks in use -> their event (made at first free)
};

} // namespace

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
  static std::mutex mu;
  static std::vector<std::unique_ptr<Allocator>> cuda;
  std::lock_guard<std::mutex> lock(mu);
  VLM_CHECK(d.index >= 0 && d.index < cuda_device_count(), "device ", d.str(),
            " is not available: ", cuda_device_query());
  if (cuda.size() <= size_t(d.index)) cuda.resize(d.index + 1);
  if (!cuda[d.index]) cuda[d.index] = std::make_unique<CudaAsyncAllocator>(d.index);
  return *cuda[d.index];
}

Allocator& pinned_host_allocator() {
  if (cuda_device_count() > 0) {
    static PinnedHostAllocator pinned;
    return pinned;
  }
  return allocator_for(Device::cpu());
}

} // namespace vlm
