// The runtime services of kernels/gpu_runtime.h (and gemm_release_stream, which streams call, the
// multi-tensor gradient kernels' host-side sizing, and the NCCL calls of kernels/nccl.h) in a
// build without the CUDA backend: there is no device, and every call that needs one throws. Code
// above the kernels calls them without #if; it only gets here for a CUDA device, which such a
// build cannot have. (The kernel launchers have no stubs: ops reach them only through
// src/core/dispatch.h, which never instantiates a CUDA body in such a build.)
#include "kernels/gemm.h"
#include "kernels/gpu_runtime.h"
#include "kernels/nccl.h"
#include "kernels/optim.h"
#include "src/base/check.h"

namespace vlm::kernels::cuda {
namespace {
[[noreturn]] void no_cuda(const char* call) {
  VLM_FAIL(call, ": this build has no CUDA backend (configure with -DVLM_CUDA=ON)");
}
} // namespace

int device_count() { return 0; }
std::string device_query() {
  return "no CUDA device: this build has no CUDA backend (configure with -DVLM_CUDA=ON)";
}
void set_device(int) { no_cuda("set_device"); }
int current_device() { no_cuda("current_device"); }
void device_synchronize() { no_cuda("device_synchronize"); }
void stream_synchronize(void*) { no_cuda("stream_synchronize"); }
void* stream_create() { no_cuda("stream_create"); }
void stream_destroy(void*) { no_cuda("stream_destroy"); }
bool stream_done(void*) { no_cuda("stream_done"); }
void stream_wait_event(void*, void*) { no_cuda("stream_wait_event"); }
void stream_begin_capture(void*) { no_cuda("stream_begin_capture"); }
int64_t stream_end_capture(void*) { no_cuda("stream_end_capture"); }
void* malloc_async(size_t, void*) { no_cuda("malloc_async"); }
void free_async(void*, void*) { no_cuda("free_async"); }
void memset_async(void*, int, size_t, void*) { no_cuda("memset_async"); }
void memcpy_h2d(void*, const void*, size_t, void*) { no_cuda("memcpy_h2d"); }
void memcpy_d2h(void*, const void*, size_t, void*) { no_cuda("memcpy_d2h"); }
void memcpy_d2d(void*, const void*, size_t, void*) { no_cuda("memcpy_d2d"); }
void* host_alloc_pinned(size_t) { no_cuda("host_alloc_pinned"); }
void host_free_pinned(void*) { no_cuda("host_free_pinned"); }
void* event_create(bool) { no_cuda("event_create"); }
void event_destroy(void*) { no_cuda("event_destroy"); }
void event_record(void*, void*) { no_cuda("event_record"); }
bool event_done(void*) { no_cuda("event_done"); }
void event_synchronize(void*) { no_cuda("event_synchronize"); }
float event_elapsed_ms(void*, void*) { no_cuda("event_elapsed_ms"); }
double peak_bf16_tflops(int) { return 0; }
bool take_device_error(int, DeviceError*) { return false; }
void check_last_launch(const char*) { no_cuda("check_last_launch"); }
LaunchCounts launch_counts() { return {}; }
void reset_launch_counts() {}
uint64_t kernel_launch_count() { return 0; }
void reset_kernel_launch_count() {}
void count_library_call() {}
void gemm_release_stream(void*) { no_cuda("gemm_release_stream"); }
// Host side of the multi-tensor gradient kernels: reached only for gradients on a CUDA device.
int64_t multi_sum_squares_num_partials(const GradSpan*, int64_t) {
  no_cuda("multi_sum_squares_num_partials");
}

bool nccl_built() { return false; }
void nccl_unique_id(void*) { no_cuda("nccl_unique_id"); }
void* nccl_comm_init(const void*, int, int) { no_cuda("nccl_comm_init"); }
void nccl_comm_destroy(void*) {}
void nccl_comm_abort(void*) {}
std::string nccl_async_error(void*) { return ""; }
void nccl_all_gather(const void*, void*, size_t, DType, void*, void*) {
  no_cuda("nccl_all_gather");
}
void nccl_reduce_scatter(const void*, void*, size_t, DType, NcclOp, void*, void*) {
  no_cuda("nccl_reduce_scatter");
}
void nccl_all_reduce(const void*, void*, size_t, DType, NcclOp, void*, void*) {
  no_cuda("nccl_all_reduce");
}
void nccl_broadcast(void*, size_t, DType, int, void*, void*) { no_cuda("nccl_broadcast"); }

} // namespace vlm::kernels::cuda
