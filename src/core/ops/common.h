// Helpers shared by the op implementations: argument checks whose messages print shapes, and
// conversions from Tensor metadata to the raw layouts kernels take. Ops run their kernels through
// src/core/dispatch.h.
#pragma once

#include <string>

#include "kernels/copy.h"
#include "src/core/autograd.h"
#include "src/core/dispatch.h"
#include "src/core/tensor.h"

namespace vlm::ops_detail {

void check_defined(const char* op, const char* name, const Tensor& t);
void check_float(const char* op, const char* name, const Tensor& t);
void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b);
void check_dim(const char* op, const char* name, const Tensor& t, int64_t ndim);

// VLM_CHECK_FINITE=1: throws naming `op` when a CUDA op's output holds NaN or Inf (a device
// count; it synchronizes). Called by the CUDA ops after their forward; does nothing otherwise.
void check_finite(const char* op, const Tensor& out);

kernels::StridedLayout strided_layout(const Tensor& t);

// A contiguous copy without autograd history (what kernels read and nodes save); undefined stays
// undefined.
Tensor plain(const Tensor& t);

// The packed documents of an op's input x ([T, ...], named `x_name` in errors): cu_seqlens must be
// [docs + 1] i32 on the CPU (the kernels read the offsets on the host), start at 0, never
// decrease and end at T = x.size(0). Errors name op, the entry and its value.
void check_cu_seqlens(const char* op, const Tensor& cu, const char* x_name, const Tensor& x);

// CUDA kernels take f32 and bf16 (f64 runs on CPU only): throws naming op and tensor otherwise,
// before anything is allocated (dispatch() would say the same without the tensor).
void check_cuda_dtype(const char* op, const Tensor& x);

} // namespace vlm::ops_detail
