// Created streams, cross-stream waits and graph capture (declared in kernels/gpu_runtime.h).
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {
using dev::as_stream;
} // namespace

void* stream_create() {
  cudaStream_t s = nullptr;
  VLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(void* stream) {
  if (stream) VLM_CUDA_CHECK(cudaStreamDestroy(as_stream(stream)));
}

bool stream_done(void* stream) {
  cudaError_t e = cudaStreamQuery(as_stream(stream));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  VLM_CUDA_CHECK(e);
  return true;
}

void stream_wait_event(void* stream, void* event) {
  VLM_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(event), 0));
}

void stream_begin_capture(void* stream) {
  VLM_CHECK(stream != nullptr,
            "stream_begin_capture: the legacy default stream cannot be captured");
  VLM_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
}

int64_t stream_end_capture(void* stream) {
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(as_stream(stream), &graph);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    VLM_FAIL("stream_end_capture: the capture failed: ", cudaGetErrorString(e),
             " (a call in it synchronized with the device or cannot be captured)");
  }
  size_t nodes = 0;
  e = cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphDestroy(graph);
  VLM_CUDA_CHECK(e);
  return int64_t(nodes);
}

} // namespace vlm::kernels::cuda
