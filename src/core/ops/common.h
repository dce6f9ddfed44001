// Helpers shared by the op implementations: argument checks whose messages print shapes, and
// conversions from Tensor metadata to the raw layouts kernels take.
#pragma once

#include <string>

#include "kernels/copy.h"
#include "src/core/autograd.h"
#include "src/core/tensor.h"

namespace vlm::ops_detail {

void check_defined(const char* op, const char* name, const Tensor& t);
void check_float(const char* op, const char* name, const Tensor& t);
void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b);
void check_dim(const char* op, const char* name, const Tensor& t, int64_t ndim);
// Ops run on CPU here; CUDA tensors fail clearly until the CUDA kernels exist.
void check_cpu(const char* op, const Tensor& t);

// VLM_CHECK_FINITE=1: throws naming `op` when a CUDA op's output holds NaN or Inf (a device
// count; it synchronizes). Called by the CUDA ops after their forward; does nothing otherwise.
void check_finite(const char* op, const Tensor& out);

kernels::StridedLayout strided_layout(const Tensor& t);

// CUDA kernels take f32 and bf16 (f64 runs on CPU only): throws naming op and tensor otherwise.
void check_cuda_dtype(const char* op, const Tensor& x);

// Calls f(T{}) with T the CUDA kernel type of `dt` (float or bf16); a clear error otherwise.
template <typename F> void with_cuda_type(DType dt, const char* op, F&& f) {
#if VLM_WITH_CUDA
  switch (dt) {
  case DType::f32: f(float{}); return;
  case DType::bf16: f(bf16{}); return;
  default: break;
  }
  VLM_FAIL(op, ": CUDA kernels take f32 or bf16, got ", dtype_name(dt), " (f64 runs on CPU only)");
#else
  (void)f;
  VLM_FAIL(op, ": this build has no CUDA backend (dtype ", dtype_name(dt), ")");
#endif
}

} // namespace vlm::ops_detail
