#include "src/core/ops/common.h"

namespace vlm::ops_detail {

void check_defined(const char* op, const char* name, const Tensor& t) {
  VLM_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
}

void check_float(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  VLM_CHECK(is_floating(t.dtype()) && t.dtype() != DType::f16, op, ": ", name,
            " must be f32, f64 or bf16, got ", t.desc());
}

void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  VLM_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", describe(name_a, a), " vs ",
            describe(name_b, b));
}

void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b) {
  VLM_CHECK(a.device() == b.device(), op, ": device mismatch, ", describe(name_a, a), " vs ",
            describe(name_b, b));
}

void check_dim(const char* op, const char* name, const Tensor& t, int64_t ndim) {
  VLM_CHECK(t.dim() == ndim, op, ": ", name, " must have ", ndim, " dims, got ", t.desc());
}

void check_cpu(const char* op, const Tensor& t) {
  VLM_CHECK(t.device().is_cpu(), op, ": no CUDA kernel yet for ", t.desc(),
            " (the CUDA backend lands op by op; run on CPU)");
}

kernels::StridedLayout strided_layout(const Tensor& t) {
  VLM_CHECK(t.dim() <= kernels::kMaxDims, "tensors have at most ", kernels::kMaxDims, " dims, got ",
            t.desc());
  kernels::StridedLayout l;
  l.ndim = int(t.dim());
  for (int d = 0; d < l.ndim; d++) {
    l.shape[d] = t.shape()[d];
    l.strides[d] = t.strides()[d];
  }
  return l;
}

} // namespace vlm::ops_detail
