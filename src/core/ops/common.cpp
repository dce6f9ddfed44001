#include "src/core/ops/common.h"

#include "kernels/elementwise.h"
#include "src/base/env.h"
#include "src/core/device_errors.h"

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

void check_finite(const char* op, const Tensor& out) {
  if (!out.defined() || !out.device().is_cuda()) return;
  // Read per call (a getenv; CUDA ops cost far more) so tests and tools can switch it.
  if (env_int("VLM_CHECK_FINITE", 0) == 0) return;
  DType t = out.dtype();
  if (t != DType::f32 && t != DType::bf16 && t != DType::f64) return;
  Tensor c = out.contiguous();
  const int64_t bad = dispatch_device(
      "check_finite", out.device(), [] { return int64_t(0); },
      [&](auto stream) {
        return kernels::cuda::count_nonfinite(t, c.data_ptr(), c.numel(), stream);
      });
  check_device_errors(out.device()); // count_nonfinite synchronized
  VLM_CHECK(bad == 0, "VLM_CHECK_FINITE: ", op, " produced ", bad, " NaN/Inf value",
            bad == 1 ? "" : "s", " in its output ", out.desc());
}

void check_cuda_dtype(const char* op, const Tensor& x) {
  if (x.device().is_cuda())
    VLM_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op,
              ": CUDA kernels take f32 or bf16, got ", x.desc(), " (f64 runs on CPU only)");
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

Tensor plain(const Tensor& t) {
  if (!t.defined()) return t;
  NoGradGuard no_grad;
  return t.contiguous().detach();
}

void check_cu_seqlens(const char* op, const Tensor& cu, const char* x_name, const Tensor& x) {
  check_defined(op, "cu_seqlens", cu);
  VLM_CHECK(cu.dtype() == DType::i32 && cu.dim() == 1 && cu.size(0) >= 2, op,
            ": cu_seqlens must be [docs+1] i32 with docs >= 1, got ", describe("cu_seqlens", cu));
  VLM_CHECK(cu.device().is_cpu(), op, ": cu_seqlens must be on the CPU (its offsets are read on",
            " the host), got ", describe("cu_seqlens", cu));
  const Tensor c = cu.contiguous();
  const int32_t* v = c.data<int32_t>();
  const int64_t n = c.size(0);
  VLM_CHECK(v[0] == 0, op, ": cu_seqlens[0] must be 0, got ", v[0], " (",
            describe("cu_seqlens", cu), ")");
  for (int64_t b = 1; b < n; b++)
    VLM_CHECK(v[b] >= v[b - 1], op, ": cu_seqlens must be non-decreasing, but cu_seqlens[", b,
              "] = ", v[b], " < cu_seqlens[", b - 1, "] = ", v[b - 1], " (",
              describe("cu_seqlens", cu), ")");
  VLM_CHECK(v[n - 1] == x.size(0), op, ": cu_seqlens[", n - 1, "] = ", v[n - 1],
            " must equal the token count T of ", describe(x_name, x));
}

} // namespace vlm::ops_detail
