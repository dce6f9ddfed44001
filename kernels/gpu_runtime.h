// CUDA runtime services for the rest of the system: device discovery, streams and events,
// stream-ordered memory, copies, launch checks and the deferred device error record. Plain C++ on
// purpose (no CUDA headers, and not named like the toolkit's <cuda_runtime.h>): src/core and the
// tests include it from g++-compiled code, and a CPU-only build sees these declarations too (it
// must never reach a call). Streams are opaque `void*` (a cudaStream_t; nullptr is the legacy
// default stream). Everything throws vlm::Error on a CUDA error, except device_count() and
// device_query(), which must work on machines without a GPU or driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vlm::kernels::cuda {

// Number of visible CUDA devices; 0 (never an exception) when there is no driver or device.
int device_count();

// One paragraph for logs and test skips: "no CUDA device: <runtime's reason>" or one entry per
// device ("cuda:0 NVIDIA H200, sm_90, 139.8 GiB, 132 SMs"), followed by the CUDA runtime and
// driver versions and the cuBLASLt, cuDNN and NCCL library versions. Never throws.
std::string device_query();

void set_device(int device);
int current_device();
void device_synchronize();
void stream_synchronize(void* stream);

// A new stream on the current device that does not synchronize with the legacy default stream
// (cudaStreamNonBlocking), so work on it (e.g. communication) can overlap the default stream's.
void* stream_create();
// Destroys a stream from stream_create; work already queued on it still completes. Call
// gemm_release_stream (kernels/gemm.h) first.
void stream_destroy(void* stream);
// True once all work queued on `stream` has finished (cudaStreamQuery).
bool stream_done(void* stream);
// Work queued on `stream` after this call waits for the work captured by the last event_record
// of `event`, which may belong to another device. No host synchronization.
void stream_wait_event(void* stream, void* event);

// CUDA graph capture of the work queued on `stream` (a created stream, not the legacy default
// one) from this thread: between begin and end, any call that would synchronize with the device
// fails (and so does the capture). Used to prove that a sequence of ops never synchronizes, and
// the start of CUDA-graph training steps. end_capture destroys the captured graph and returns its
// node count; it throws when the capture was invalidated.
void stream_begin_capture(void* stream);
int64_t stream_end_capture(void* stream);

// Stream-ordered allocation from the current device's default memory pool. The pool keeps freed
// blocks (release threshold UINT64_MAX), so steady-state training does no cudaMalloc at all.
// malloc_async(0) returns nullptr; free_async(nullptr) does nothing.
void* malloc_async(size_t bytes, void* stream);
void free_async(void* p, void* stream);
void memset_async(void* p, int value, size_t bytes, void* stream);

// Copies of `bytes` bytes ordered on `stream`. They return before the copy finishes whenever
// the runtime can (always for device memory and pinned host memory): call stream_synchronize
// before reading a host destination.
void memcpy_h2d(void* dst, const void* src, size_t bytes, void* stream);
void memcpy_d2h(void* dst, const void* src, size_t bytes, void* stream);
void memcpy_d2d(void* dst, const void* src, size_t bytes, void* stream);

// Page-locked host memory, for asynchronous host<->device copies. host_alloc_pinned(0) returns
// nullptr; host_free_pinned(nullptr) does nothing.
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* p);

// Events, for stream-ordered reuse of host buffers and for timing. An event is an opaque `void*`
// (a cudaEvent_t). event_create(true) makes a timing event; false a cheaper one without timing.
void* event_create(bool timing);
void event_destroy(void* event);
void event_record(void* event, void* stream);
// True once all work captured by the last event_record has finished (never recorded: true).
bool event_done(void* event);
void event_synchronize(void* event);
// Milliseconds between two recorded timing events (after both have completed).
float event_elapsed_ms(void* start, void* end);

// Dense bf16 tensor-core peak of `device` in TFLOP/s (no sparsity), from its compute capability
// and name: H100/H200/GH200 SXM 989.4, H100 PCIe 756.5, A100 312, L40S 362; 0 when unknown. The
// trainer's MFU uses it when logging.peak_tflops = 0.
double peak_bf16_tflops(int device);

// --- deferred device errors ----------------------------------------------------------------------
// Kernels cannot throw. One that finds a bad value (an index or label out of range) writes the
// first failure into a small per-device record (device memory for the claim, mapped pinned host
// memory for the fields), skips the access that would be out of bounds, and carries on; nothing
// synchronizes. The host reads the record after its next synchronization with the device
// (src/core/device_errors.h turns it into a vlm::Error). `site` identifies the failing call; the
// kernels only pass it through.
struct DeviceError {
  int32_t site = 0;     // from the launch (src/core registers what it means)
  int64_t position = 0; // where the bad value was (flat element index)
  int64_t value = 0;    // the bad value
  int64_t limit = 0;    // the valid range was [0, limit)
};
// True when a kernel on `device` has reported a failure since the last call: copies it to *error
// and clears the record for the next one. Only reads host memory unless a failure is pending (no
// CUDA call, never synchronizes); call it after synchronizing with the work that may report.
bool take_device_error(int device, DeviceError* error);

// Call after every kernel launch: throws naming `op` if the launch failed. With VLM_SYNC=1 in
// the environment it also synchronizes the device, so an asynchronous fault is reported at the
// op that caused it rather than at some later call. It also counts the launch (below): every
// launcher under kernels/cuda calls it once per launch it makes (a library routine that launches
// several kernels, e.g. cub's radix sort, counts as one).
void check_last_launch(const char* op);

// --- launch and synchronization counters ---------------------------------------------------------
// Process-wide counts (all devices and threads; relaxed atomics, so cheap enough to stay on) of
// what the host asks of the GPUs, for tests and benchmarks that bound the launches and host
// synchronizations of a training step. A build without CUDA always reports zeros.
struct LaunchCounts {
  uint64_t kernels = 0;       // kernel launches (check_last_launch calls)
  uint64_t library_calls = 0; // cuBLASLt / cuDNN calls reported by count_library_call
  uint64_t h2d_copies = 0;    // memcpy_h2d calls (pinned or pageable source)
  uint64_t d2h_copies = 0;    // memcpy_d2h calls: host reads of device memory
  uint64_t syncs = 0;         // stream_synchronize, event_synchronize, device_synchronize
  // Of h2d_copies, those from pageable host memory: the driver stages them through its own pinned
  // buffer before the call returns (a host stall; never asynchronous). A training step should
  // have none (uploads go through pinned staging: Tensor::empty_pinned).
  uint64_t h2d_pageable = 0;
};
LaunchCounts launch_counts();
void reset_launch_counts();
// The kernel launches alone (launch_counts().kernels) and their reset (resets every counter).
uint64_t kernel_launch_count();
void reset_kernel_launch_count();
// Called by the wrappers of library calls that enqueue GPU work (a cuBLASLt matmul, a cuDNN graph
// execution): counted apart from kernel launches.
void count_library_call();

} // namespace vlm::kernels::cuda
