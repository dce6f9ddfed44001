// Device and dtype dispatch for ops: one call picks the backend and binds the element type.
//
//   dispatch(op, device, dtype,
//            [&](auto t) { using T = decltype(t); kernels::cpu::foo<T>(...); },
//            [&](auto t, void* stream) { using T = decltype(t); kernels::cuda::foo<T>(..., stream);
//            });
//
// The CPU body runs with T = float, double or bf16; the CUDA body with T = float or bf16, on
// current_stream(device) with `device` made current (DeviceGuard), so a process driving several
// GPUs launches on the right one. Unsupported dtypes fail naming the op (f64 on CUDA says it runs
// on the CPU only). Both bodies are generic lambdas: a CPU-only build never instantiates the CUDA
// one, so its calls into kernels::cuda:: (declared in plain C++ headers, defined only in CUDA
// builds) need no #if; reaching it there fails with "this build has no CUDA backend".
// dispatch_device is the same without a dtype, for type-erased kernels and copies. With VLM_SYNC=1
// a deferred device error (src/core/device_errors.h) is thrown right after the op that caused it.
#pragma once

#include <type_traits>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/core/device.h"
#include "src/core/device_errors.h"
#include "src/core/stream.h"

namespace vlm {

namespace dispatch_detail {
[[noreturn]] inline void no_cuda(const char* op, Device device) {
  VLM_FAIL(op, ": ", device.str(),
           " requested but this build has no CUDA backend (configure with -DVLM_CUDA=ON)");
}

// f(), then (VLM_SYNC=1 only) the device's deferred errors, so they name the op that caused them.
template <typename F> decltype(auto) run_cuda(Device device, F&& f) {
  if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
    f();
    check_device_errors_if_syncing(device);
  } else {
    auto result = f();
    check_device_errors_if_syncing(device);
    return result;
  }
}
} // namespace dispatch_detail

// cpu() on the CPU; cuda(stream) on a CUDA device (current, stream = its current stream).
template <typename Cpu, typename Cuda>
decltype(auto) dispatch_device(const char* op, Device device, Cpu&& cpu, Cuda&& cuda) {
  if (device.is_cpu()) return cpu();
#if VLM_WITH_CUDA
  DeviceGuard on(device);
  void* stream = current_stream(device).handle();
  return dispatch_detail::run_cuda(device, [&] { return cuda(stream); });
#else
  (void)cuda;
  dispatch_detail::no_cuda(op, device);
#endif
}

// cpu(T{}) with T = float, double or bf16 on the CPU; cuda(T{}, stream) with T = float or bf16
// on a CUDA device (current, stream = its current stream).
template <typename Cpu, typename Cuda>
decltype(auto) dispatch(const char* op, Device device, DType dtype, Cpu&& cpu, Cuda&& cuda) {
  if (device.is_cpu()) {
    switch (dtype) {
    case DType::f32: return cpu(float{});
    case DType::f64: return cpu(double{});
    case DType::bf16: return cpu(bf16{});
    default: VLM_FAIL(op, ": unsupported dtype ", dtype_name(dtype));
    }
  }
#if VLM_WITH_CUDA
  DeviceGuard on(device);
  void* stream = current_stream(device).handle();
  switch (dtype) {
  case DType::f32: return dispatch_detail::run_cuda(device, [&] { return cuda(float{}, stream); });
  case DType::bf16: return dispatch_detail::run_cuda(device, [&] { return cuda(bf16{}, stream); });
  default:
    VLM_FAIL(op, ": CUDA kernels take f32 or bf16, got ", dtype_name(dtype),
             " (f64 runs on CPU only)");
  }
#else
  (void)cuda;
  dispatch_detail::no_cuda(op, device);
#endif
}

} // namespace vlm
