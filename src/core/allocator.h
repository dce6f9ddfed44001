// Allocators with current/peak accounting of the bytes tensors hold. CPU: 64-byte aligned blocks
// from a size-class cache (a training step frees and re-allocates the same activation sizes; going
// back to the OS each time costs page faults on every large buffer). CUDA: stream-ordered
// cudaMallocAsync on the device's pool (freed blocks stay cached in the pool), each block freed on
// the stream it was allocated on. No allocator call changes the caller's current device.
#pragma once

#include <atomic>
#include <cstddef>

#include "src/core/device.h"
#include "src/core/stream.h"

namespace vlm {

struct MemoryStats {
  size_t current_bytes = 0;
  size_t peak_bytes = 0;
  size_t num_allocs = 0;
  size_t cached_bytes = 0; // freed blocks kept for reuse (CPU cache)
};

class Allocator {
public:
  virtual ~Allocator() = default;
  // A block ordered on `stream` (CUDA: usable by work queued there from now on); it must be freed
  // with the same stream, after the work of every other stream that used it (Storage does this).
  // The stream is ignored by host allocators.
  virtual void* allocate(size_t bytes, const Stream& stream) = 0;
  virtual void deallocate(void* p, size_t bytes, const Stream& stream) = 0;
  virtual Device device() const = 0;

  MemoryStats stats() const {
    return {current_.load(), peak_.load(), count_.load(), cached_bytes()};
  }
  // Returns cached free blocks to the system.
  virtual void empty_cache() {}
  virtual size_t cached_bytes() const { return 0; }
  // Peak is reset to the current usage (e.g. at the start of a step).
  void reset_peak() { peak_ = current_.load(); }

protected:
  void record_alloc(size_t bytes);
  void record_free(size_t bytes);

private:
  std::atomic<size_t> current_{0}, peak_{0}, count_{0};
};

// The process-wide allocator for a device (created on first use).
Allocator& allocator_for(Device d);

// Page-locked host memory (device CPU) for batches on their way to a GPU: copies out of it are
// truly asynchronous. A freed block is reused only after the work queued on the current stream of
// the current CUDA device when it was freed has finished, so an H2D copy still reading it is
// never overwritten (free a staging tensor under the stream its copy ran on). Without a CUDA
// device this is allocator_for(Device::cpu()).
Allocator& pinned_host_allocator();

} // namespace vlm
