// CUDA runtime services declared in kernels/gpu_runtime.h.
#include "kernels/gpu_runtime.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "src/base/env.h"

namespace vlm::kernels::cuda {
namespace {

using dev::as_stream;

// The result of the first cudaGetDeviceCount, kept so later calls (and device_query) agree and
// a machine without a driver does not retry initialization on every call.
struct DeviceProbe {
  int count = 0;
  cudaError_t error = cudaSuccess;
};

const DeviceProbe& probe() {
  static const DeviceProbe p = [] {
    DeviceProbe r;
    r.error = cudaGetDeviceCount(&r.count);
    if (r.error != cudaSuccess) {
      r.count = 0;
      // Clear a non-sticky error. (When the runtime cannot initialize at all, e.g. without a
      // driver, every later call, cudaGetLastError included, reports that error again; nothing
      // should be launched then anyway.)
      cudaGetLastError();
    }
    return r;
  }();
  return p;
}

// "13.0" from 13000 (CUDA's encoding: 1000 * major + 10 * minor).
std::string cuda_version_text(int v) {
  if (v <= 0) return "none";
  return detail::str_cat(v / 1000, ".", (v % 1000) / 10);
}

// "9.14.0" from 91400 (cuBLASLt, cuDNN >= 9 and NCCL >= 2.9 all use 10000 * major + 100 * minor
// + patch).
std::string lib_version_text(long long v) {
  return detail::str_cat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

std::string library_versions() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver); // 0 when no driver is installed
#if VLM_WITH_CUDNN
  std::string cudnn_text = lib_version_text(static_cast<long long>(cudnnGetVersion()));
#else
  std::string cudnn_text = "not built";
#endif
#if VLM_WITH_NCCL
  int nccl = 0;
  std::string nccl_text = ncclGetVersion(&nccl) == ncclSuccess ? lib_version_text(nccl) : "?";
#else
  std::string nccl_text = "not built";
#endif
  cudaGetLastError();
  return detail::str_cat("CUDA runtime ", cuda_version_text(runtime), ", driver ",
                         cuda_version_text(driver), ", cuBLASLt ",
                         lib_version_text(static_cast<long long>(cublasLtGetVersion())), ", cuDNN ",
                         cudnn_text, ", NCCL ", nccl_text);
}

// The device whose pool cudaMallocAsync uses: the stream's device (the current one for the
// legacy default stream).
int stream_device(void* stream) {
  int dev = 0;
#if CUDART_VERSION >= 12080
  if (stream) {
    VLM_CUDA_CHECK(cudaStreamGetDevice(as_stream(stream), &dev));
    return dev;
  }
#endif
  VLM_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// By default a pool returns freed memory to the OS at every synchronization, which turns each
// training step into cudaMalloc/cudaFree calls. Keeping everything cached is what makes
// cudaMallocAsync a caching allocator. Done once per device; a race only repeats the idempotent
// attribute set.
cudaMemPool_t cached_pool(int dev) {
  static std::atomic<uint64_t> configured{0}; // bit d: device d done (devices >= 64: always set)
  cudaMemPool_t pool;
  VLM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  bool done = dev < 64 && ((configured.load(std::memory_order_acquire) >> dev) & 1u);
  if (!done) {
    uint64_t threshold = UINT64_MAX;
    VLM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    if (dev < 64) configured.fetch_or(uint64_t(1) << dev, std::memory_order_acq_rel);
  }
  return pool;
}

double gib(uint64_t bytes) { return double(bytes) / double(1ull << 30); }

// The counters of launch_counts().
struct Counters {
  std::atomic<uint64_t> kernels{0}, library_calls{0}, h2d{0}, d2h{0}, syncs{0}, h2d_pageable{0};
};
Counters& counters() {
  static Counters c;
  return c;
}
void bump(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

} // namespace

LaunchCounts launch_counts() {
  Counters& c = counters();
  LaunchCounts r;
  r.kernels = c.kernels.load(std::memory_order_relaxed);
  r.library_calls = c.library_calls.load(std::memory_order_relaxed);
  r.h2d_copies = c.h2d.load(std::memory_order_relaxed);
  r.d2h_copies = c.d2h.load(std::memory_order_relaxed);
  r.syncs = c.syncs.load(std::memory_order_relaxed);
  r.h2d_pageable = c.h2d_pageable.load(std::memory_order_relaxed);
  return r;
}

void reset_launch_counts() {
  Counters& c = counters();
  for (auto* a : {&c.kernels, &c.library_calls, &c.h2d, &c.d2h, &c.syncs, &c.h2d_pageable})
    a->store(0, std::memory_order_relaxed);
}

uint64_t kernel_launch_count() { return counters().kernels.load(std::memory_order_relaxed); }
void reset_kernel_launch_count() { reset_launch_counts(); }
void count_library_call() { bump(counters().library_calls); }

int device_count() { return probe().count; }

std::string device_query() {
  // No VLM_CUDA_CHECK here: this text is what gets printed when things are broken.
  const DeviceProbe& p = probe();
  std::string out;
  if (p.count == 0) {
    out = p.error != cudaSuccess
              ? detail::str_cat("no CUDA device: ", cudaGetErrorString(p.error), " (",
                                cudaGetErrorName(p.error), ")")
              : std::string("no CUDA device: the CUDA runtime reports 0 devices");
  } else {
    for (int d = 0; d < p.count; ++d) {
      cudaDeviceProp prop{};
      cudaError_t e = cudaGetDeviceProperties(&prop, d);
      if (d > 0) out += "; ";
      if (e != cudaSuccess) {
        cudaGetLastError();
        out +=
            detail::str_cat("cuda:", d, " (properties unavailable: ", cudaGetErrorString(e), ")");
        continue;
      }
      char mem[32];
      std::snprintf(mem, sizeof mem, "%.1f GiB", gib(prop.totalGlobalMem));
      out += detail::str_cat("cuda:", d, " ", prop.name, ", sm_", prop.major, prop.minor, ", ", mem,
                             ", ", prop.multiProcessorCount, " SMs");
    }
  }
  return out + "; " + library_versions();
}

void set_device(int device) { VLM_CUDA_CHECK(cudaSetDevice(device)); }

int current_device() {
  int dev = 0;
  VLM_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void device_synchronize() {
  bump(counters().syncs);
  VLM_CUDA_CHECK(cudaDeviceSynchronize());
}

void stream_synchronize(void* stream) {
  bump(counters().syncs);
  VLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void* malloc_async(size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  int dev = stream_device(stream);
  cudaMemPool_t pool = cached_pool(dev);
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, bytes, as_stream(stream));
  if (e == cudaErrorMemoryAllocation) {
    // Blocks freed on other streams are reusable only once their frees have completed: wait for
    // the device and try once more before giving up.
    cudaGetLastError();
    VLM_CUDA_CHECK(cudaDeviceSynchronize());
    e = cudaMallocAsync(&p, bytes, as_stream(stream));
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    uint64_t reserved = 0, used = 0;
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    char detail_text[160];
    std::snprintf(detail_text, sizeof detail_text,
                  "pool reserved %.2f GiB, in use %.2f GiB; device free %.2f of %.2f GiB",
                  gib(reserved), gib(used), gib(free_b), gib(total_b));
    VLM_FAIL("cudaMallocAsync of ", bytes, " bytes on cuda:", dev,
             " failed: ", cudaGetErrorString(e), " (", detail_text, ")");
  }
  return p;
}

void free_async(void* p, void* stream) {
  if (p) VLM_CUDA_CHECK(cudaFreeAsync(p, as_stream(stream)));
}

void memset_async(void* p, int value, size_t bytes, void* stream) {
  if (bytes) VLM_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, as_stream(stream)));
}

namespace {
// True when p is host memory the CUDA runtime does not know (neither page-locked nor mapped).
bool pageable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered;
}
} // namespace

void memcpy_h2d(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  bump(counters().h2d);
  if (pageable(src)) bump(counters().h2d_pageable);
  VLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}

void memcpy_d2h(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) bump(counters().d2h);
  if (bytes)
    VLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
}

void memcpy_d2d(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes)
    VLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}

void* host_alloc_pinned(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  VLM_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void host_free_pinned(void* p) {
  if (p) VLM_CUDA_CHECK(cudaFreeHost(p));
}

void* event_create(bool timing) {
  cudaEvent_t e = nullptr;
  VLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

void event_destroy(void* event) {
  if (event) VLM_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}

void event_record(void* event, void* stream) {
  VLM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(stream)));
}

bool event_done(void* event) {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  VLM_CUDA_CHECK(e);
  return true;
}

void event_synchronize(void* event) {
  bump(counters().syncs);
  VLM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

float event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  VLM_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

double peak_bf16_tflops(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const std::string name = prop.name;
  const bool pcie = name.find("PCIe") != std::string::npos;
  if (prop.major == 9 && prop.minor == 0) return pcie ? 756.5 : 989.4; // H100, H200, GH200
  if (prop.major == 8 && prop.minor == 0) return 312.0;                // A100
  if (prop.major == 8 && prop.minor == 9 && name.find("L40S") != std::string::npos) return 362.1;
  return 0;
}

void check_last_launch(const char* op) {
  bump(counters().kernels);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) VLM_FAIL("CUDA error launching ", op, ": ", cudaGetErrorString(e));
  // Read once: this runs after every launch.
  static const bool sync = env_int("VLM_SYNC", 0) != 0;
  if (sync) {
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
      VLM_FAIL("CUDA error in ", op, " (found by VLM_SYNC=1): ", cudaGetErrorString(e));
  }
}

} // namespace vlm::kernels::cuda
