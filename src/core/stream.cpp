#include "src/core/stream.h"

#include <vector>

#include "kernels/gemm.h"
#include "kernels/gpu_runtime.h"
#include "src/base/check.h"
#include "src/core/device_errors.h"

namespace vlm {

namespace cu = kernels::cuda;

namespace {

// Destroys a created CUDA stream when its last Stream goes: first the cuBLASLt handle and
// workspace kept for it (waits for the stream), then the stream. Never throws (a deleter).
void destroy_stream(Device device, void* handle) {
  try {
    DeviceGuard on(device);
    cu::gemm_release_stream(handle);
    cu::stream_destroy(handle);
  } catch (...) {
    // At process exit the runtime may be gone already; nothing useful can be done here.
  }
}

// This thread's current streams, indexed by CUDA device; a missing entry is the default stream.
thread_local std::vector<Stream> t_current;

} // namespace

Stream Stream::default_stream(Device device) {
  return Stream(device.is_cpu() ? Device::cpu() : device, nullptr);
}

Stream Stream::create(Device device) {
  if (device.is_cpu()) return Stream();
  DeviceGuard on(device);
  void* handle = cu::stream_create();
  return Stream(device,
                std::shared_ptr<void>(handle, [device](void* h) { destroy_stream(device, h); }));
}

void Stream::synchronize() const {
  if (device_.is_cpu()) return;
  DeviceGuard on(device_);
  cu::stream_synchronize(handle());
  check_device_errors(device_);
}

bool Stream::query() const {
  if (device_.is_cpu()) return true;
  DeviceGuard on(device_);
  return cu::stream_done(handle());
}

void Stream::wait(const Event& event) const {
  if (!event.recorded() || event.device().is_cpu()) return; // CPU work is already complete
  if (device_.is_cpu()) {
    event.synchronize();
    return;
  }
  DeviceGuard on(device_);
  cu::stream_wait_event(handle(), event.handle());
}

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream();
  if (device.index >= 0 && size_t(device.index) < t_current.size() &&
      t_current[size_t(device.index)].device() == device)
    return t_current[size_t(device.index)];
  return Stream::default_stream(device);
}

void set_current_stream(const Stream& stream) {
  const Device d = stream.device();
  if (d.is_cpu()) return;
  VLM_CHECK(d.index >= 0, "set_current_stream: bad device ", d.str());
  if (t_current.size() <= size_t(d.index)) t_current.resize(size_t(d.index) + 1);
  t_current[size_t(d.index)] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() { set_current_stream(previous_); }

DeviceGuard::DeviceGuard(Device device) {
  if (!device.is_cuda()) return;
  const int now = cu::current_device();
  if (now == device.index) return;
  cu::set_device(device.index);
  previous_ = now;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ < 0) return;
  try {
    cu::set_device(previous_);
  } catch (...) {
    // Restoring a device that was current a moment ago only fails on a broken context, which
    // the next CUDA call reports anyway; a destructor must not throw.
  }
}

Event::~Event() {
  if (!handle_) return;
  try {
    DeviceGuard on(device_);
    cu::event_destroy(handle_);
  } catch (...) {
    // As destroy_stream: nothing useful to do in a destructor.
  }
}

Event::Event(Event&& other) noexcept
    : timing_(other.timing_), recorded_(other.recorded_), device_(other.device_),
      handle_(other.handle_), host_time_(other.host_time_) {
  other.handle_ = nullptr;
  other.recorded_ = false;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this)); // releases this event's handle at the end of the scope
    timing_ = other.timing_;
    recorded_ = other.recorded_;
    device_ = other.device_;
    handle_ = other.handle_;
    host_time_ = other.host_time_;
    other.handle_ = nullptr;
    other.recorded_ = false;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  const Device d = stream.device();
  if (recorded_ || handle_)
    VLM_CHECK(d == device_, "Event::record: the event belongs to ", device_.str(),
              ", the stream to ", d.str(), " (use one event per device)");
  device_ = d;
  recorded_ = true;
  if (d.is_cpu()) {
    host_time_ = std::chrono::steady_clock::now();
    return;
  }
  DeviceGuard on(d);
  if (!handle_) handle_ = cu::event_create(timing_);
  cu::event_record(handle_, stream.handle());
}

bool Event::query() const {
  if (!recorded_ || device_.is_cpu()) return true;
  DeviceGuard on(device_);
  return cu::event_done(handle_);
}

void Event::synchronize() const {
  if (!recorded_ || device_.is_cpu()) return;
  DeviceGuard on(device_);
  cu::event_synchronize(handle_);
  check_device_errors(device_);
}

float Event::elapsed_ms(const Event& end) const {
  VLM_CHECK(recorded_ && end.recorded_, "Event::elapsed_ms: both events must be recorded");
  VLM_CHECK(device_ == end.device_, "Event::elapsed_ms: events of different devices (",
            device_.str(), ", ", end.device_.str(), ")");
  if (device_.is_cpu())
    return std::chrono::duration<float, std::milli>(end.host_time_ - host_time_).count();
  VLM_CHECK(timing_ && end.timing_,
            "Event::elapsed_ms: CUDA events need timing (construct them with Event(true))");
  end.synchronize();
  DeviceGuard on(device_);
  return cu::event_elapsed_ms(handle_, end.handle_);
}

void synchronize_device(Device device) {
  if (!device.is_cuda()) return;
  DeviceGuard on(device);
  cu::device_synchronize();
  check_device_errors(device);
}

} // namespace vlm
