// CUDA runtime services for the rest of the system: device discovery, stream-ordered memory,
// copies and launch checks. Plain C++ on purpose (no CUDA headers): src/core and the tests
// include it from g++-compiled code. Streams are opaque `void*` (a cudaStream_t; nullptr is the
// legacy default stream). Everything throws vlm::Error on a CUDA error, except device_count()
// and device_query(), which must work on machines without a GPU or driver.
#pragma once

#include <cstddef>
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

// Call after every kernel launch: throws naming `op` if the launch failed. With VLM_SYNC=1 in
// the environment it also synchronizes the device, so an asynchronous fault is reported at the
// op that caused it rather than at some later call.
void check_last_launch(const char* op);

} // namespace vlm::kernels::cuda
