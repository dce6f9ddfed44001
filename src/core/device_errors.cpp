#include "src/core/device_errors.h"

#include <mutex>
#include <vector>

#include "kernels/gpu_runtime.h"
#include "src/base/check.h"
#include "src/base/env.h"

namespace vlm {

namespace {

constexpr size_t kSites = 4096;

struct Site {
  int32_t id = 0;
  DeviceErrorFormatter describe;
};

struct Registry {
  std::mutex mu;
  std::vector<Site> sites = std::vector<Site>(kSites);
  int32_t next = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

} // namespace

int32_t register_device_check(DeviceErrorFormatter describe) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int32_t id = r.next;
  r.next = r.next == INT32_MAX ? 1 : r.next + 1;
  Site& s = r.sites[size_t(id) % kSites];
  s.id = id;
  s.describe = std::move(describe);
  return id;
}

void check_device_errors(Device device) {
  if (!device.is_cuda()) return;
  kernels::cuda::DeviceError e;
  if (!kernels::cuda::take_device_error(device.index, &e)) return;
  std::string text;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const Site& s = r.sites[size_t(e.site) % kSites];
    if (e.site > 0 && s.id == e.site && s.describe) text = s.describe(e.position, e.value);
  }
  if (text.empty())
    text =
        detail::str_cat("a CUDA op found the value ", e.value, " at position ", e.position,
                        ", out of range [0, ", e.limit, ") (the op's details are no longer kept)");
  VLM_FAIL(text, " [found on ", device.str(),
           " by a deferred device-side check; reported at the next synchronization]");
}

void check_device_errors_if_syncing(Device device) {
  static const bool sync = env_int("VLM_SYNC", 0) != 0; // read once, as check_last_launch does
  if (sync) check_device_errors(device);
}

} // namespace vlm
