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

kernels::StridedLayout strided_layout(const Tensor& t);

} // namespace vlm::ops_detail
