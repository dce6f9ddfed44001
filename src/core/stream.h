// Streams, events and the current device: where device work is queued and how queues are ordered.
//
// Every op, tensor creation and copy launches on current_stream(device): a per-thread, per-device
// setting that starts as the device's default stream (for CUDA the legacy default stream, handle
// nullptr) and is changed for a scope with StreamGuard. Stream::create makes a stream that runs
// concurrently with the default one (FSDP's communication stream); Events order streams without
// blocking the host. A CUDA block is freed on the stream it was allocated on (Storage records it),
// so a tensor used on another stream must be ordered before it is freed (record an Event there and
// wait on it), as FSDP's unit-owned buffers are. DeviceGuard makes a device current for a scope;
// ops, allocators and copies use it, so nothing changes the caller's current device.
//
// On the CPU everything here is a no-op: CPU ops run synchronously on the calling thread, so the
// CPU stream is always complete, and an Event on it holds the host time of its record.
//
// Synchronizing (Stream::synchronize, Event::synchronize) also checks the device's deferred error
// record (src/core/device_errors.h) and throws what a kernel reported since the last check.
#pragma once

#include <chrono>
#include <memory>

#include "src/core/device.h"

namespace vlm {

class Event;

class Stream {
public:
  // The CPU stream.
  Stream() = default;
  // The device's default stream (CUDA: the legacy default stream).
  static Stream default_stream(Device device);
  // A new stream on `device` (CUDA: non-blocking, so it overlaps the default stream; CPU: the CPU
  // stream). Copies share it; the last copy to go releases its cuBLASLt workspace and destroys it
  // (queued work still completes). Tensors allocated on it keep it alive until they are freed.
  static Stream create(Device device);

  Device device() const { return device_; }
  // The cudaStream_t (nullptr: the CPU or the legacy default stream), for kernel launchers.
  void* handle() const { return handle_.get(); }
  bool is_default() const { return handle_ == nullptr; }

  // Blocks the host until the work queued so far has finished, then throws any deferred device
  // error of this device.
  void synchronize() const;
  // True when all queued work has finished (never blocks; always true on the CPU).
  bool query() const;
  // Work queued on this stream after the call waits for `event` (as last recorded), without
  // blocking the host. The CPU stream waits by blocking the host on a CUDA event.
  void wait(const Event& event) const;

  bool operator==(const Stream& other) const {
    return device_ == other.device_ && handle() == other.handle();
  }

private:
  Stream(Device device, std::shared_ptr<void> handle)
      : device_(device), handle_(std::move(handle)) {}
  Device device_;
  std::shared_ptr<void> handle_; // owns created streams; null for default streams
};

// This thread's current stream of `device` (initially Stream::default_stream(device)).
Stream current_stream(Device device);
// Makes `stream` this thread's current stream of stream.device().
void set_current_stream(const Stream& stream);

// Sets the current stream of stream.device() for a scope and restores the previous one.
class StreamGuard {
public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

private:
  Stream previous_;
};

// Makes `device` the CUDA current device for a scope and restores the previous one (which
// decides where legacy-default-stream work, cudaMalloc and cuBLASLt handles go). No-op for the
// CPU and when the device is already current.
class DeviceGuard {
public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
  int previous_ = -1; // the device to restore; -1: nothing to do
};

// A marker in a stream's work: record it, let other streams wait for it, or wait for it on the
// host. The CUDA event is created at the first record on a CUDA stream; later records must use a
// stream of the same device. Movable (a moved-from event is unrecorded), not copyable.
class Event {
public:
  // `timing`: the event can measure elapsed_ms (CUDA events without timing are cheaper).
  explicit Event(bool timing = false) : timing_(timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued on `stream` so far (CPU: the host time now).
  void record(const Stream& stream);
  // Records on current_stream(device).
  void record(Device device) { record(current_stream(device)); }
  // True when the captured work has finished (or the event was never recorded).
  bool query() const;
  // Blocks the host until the captured work has finished, then throws any deferred device error
  // of the event's device.
  void synchronize() const;
  // Milliseconds from this event to `end` (both recorded on the same device; timing events on
  // CUDA); waits for `end`.
  float elapsed_ms(const Event& end) const;

  bool recorded() const { return recorded_; }
  Device device() const { return device_; }
  // The cudaEvent_t (nullptr before a record on a CUDA stream), for kernel-level code.
  void* handle() const { return handle_; }

private:
  bool timing_ = false;
  bool recorded_ = false;
  Device device_;
  void* handle_ = nullptr;
  std::chrono::steady_clock::time_point host_time_{};
};

// Blocks until all work on `device` (every stream) has finished, then throws any deferred device
// error of the device. No-op for the CPU.
void synchronize_device(Device device);

} // namespace vlm
