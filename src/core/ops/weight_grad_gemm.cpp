#include "src/core/ops/weight_grad_gemm.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/self_check.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::ops_detail {

using kernels::cpu::GemmShape;

namespace {

constexpr const char* kOp = "weight-gradient gemm (bf16 x bf16 -> f32)";

// The CUDA helpers are templates on the stream argument so that only dispatch_device's CUDA body
// instantiates them: a CPU-only build has no kernels::cuda::gemm.
template <typename Stream>
void mixed_gemm_cuda(float* c, const bf16* a, const bf16* b, const GemmShape& s, float beta,
                     Stream stream) {
  kernels::cuda::gemm(c, kernels::cuda::GemmType::f32, a, b, kernels::cuda::GemmType::bf16, s.M,
                      s.N, s.K, s.trans_a, s.trans_b, 1.f, beta, s.batch, s.stride_a, s.stride_b,
                      s.stride_c, stream);
}

// The fallback: the bf16 GEMM's product (one rounding to bf16), widened and added to c.
template <typename Stream>
void bf16_product_added(float* c, const bf16* a, const bf16* b, const GemmShape& s, float beta,
                        Device device, Stream stream) {
  Tensor product = Tensor::empty({s.M, s.N}, DType::bf16, device);
  for (int64_t i = 0; i < s.batch; i++) {
    kernels::cuda::gemm(product.data_ptr(), kernels::cuda::GemmType::bf16, a + i * s.stride_a,
                        b + i * s.stride_b, kernels::cuda::GemmType::bf16, s.M, s.N, s.K, s.trans_a,
                        s.trans_b, 1.f, 0.f, 1, 0, 0, 0, stream);
    Tensor acc = Tensor::borrow(c + i * s.stride_c, {s.M, s.N}, DType::f32, device, nullptr);
    if (beta == 0.f)
      copy_(acc, product);
    else
      add_(acc, product.to(DType::f32));
  }
}

// `values` copied to `device`, `shift` elements into a fresh allocation (shift 1: no longer
// 16-byte aligned, which changes cuBLASLt's choice of kernel).
Tensor placed(const Tensor& values, Device device, int64_t shift) {
  Tensor buffer = Tensor::empty({values.numel() + shift}, values.dtype(), device);
  Tensor view = buffer.as_strided(values.shape(), contiguous_strides(values.shape()), shift);
  copy_(view, values);
  return view;
}

// op(a) op(b) in f64 from the (bf16) values of a and b, row-major [M, N].
std::vector<double> product_f64(const Tensor& a, const Tensor& b, const GemmShape& s) {
  const std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
  std::vector<double> c(size_t(s.M * s.N), 0.0);
  for (int64_t i = 0; i < s.M; i++)
    for (int64_t k = 0; k < s.K; k++) {
      const double aik = av[size_t(s.trans_a ? k * s.M + i : i * s.K + k)];
      for (int64_t j = 0; j < s.N; j++)
        c[size_t(i * s.N + j)] += aik * bv[size_t(s.trans_b ? j * s.K + k : k * s.N + j)];
    }
  return c;
}

} // namespace

double weight_grad_gemm_check_error(bool trans_a, bool trans_b, Device device,
                                    const Bf16F32Gemm& gemm) {
  struct Size {
    int64_t M, N, K;
  };
  // No size a multiple of a tile; M = 1 as a bias's gradient; K = 4099 as a batch's tokens.
  const Size sizes[] = {{37, 70, 129}, {1, 70, 129}, {40, 72, 4099}};
  Rng rng(20260634);
  double error = 0;
  for (const Size& z : sizes) {
    GemmShape s;
    s.M = z.M;
    s.N = z.N;
    s.K = z.K;
    s.trans_a = trans_a;
    s.trans_b = trans_b;
    const Tensor a = Tensor::randn(trans_a ? Shape{z.K, z.M} : Shape{z.M, z.K}, rng, DType::bf16);
    const Tensor b = Tensor::randn(trans_b ? Shape{z.N, z.K} : Shape{z.K, z.N}, rng, DType::bf16);
    const Tensor start = Tensor::randn({z.M, z.N}, rng, DType::f32);
    const Tensor nans = Tensor::full({z.M, z.N}, std::numeric_limits<double>::quiet_NaN());
    const std::vector<double> product = product_f64(a, b, s);
    std::vector<double> onto_start = start.to_doubles();
    for (size_t i = 0; i < onto_start.size(); i++) onto_start[i] += product[i];
    for (int64_t shift : {0, 1}) {
      const Tensor ad = placed(a, device, shift), bd = placed(b, device, shift);
      for (float beta : {1.f, 0.f}) {
        Tensor c = placed(beta == 1.f ? start : nans, device, shift);
        gemm(c.data<float>(), ad.data<bf16>(), bd.data<bf16>(), s, beta);
        error = std::max(error, max_rel_error(c.to_doubles(), beta == 1.f ? onto_start : product));
      }
    }
  }
  return error;
}

void weight_grad_gemm(float* c, const bf16* a, const bf16* b, const GemmShape& s, float beta,
                      Device device) {
  VLM_CHECK(beta == 0.f || beta == 1.f, kOp, ": beta must be 0 or 1, got ", beta);
  dispatch_device(
      kOp, device, [&] { kernels::cpu::gemm_bf16_f32(c, a, b, s, 1.f, beta); },
      [&](auto stream) {
        const std::string key = detail::str_cat(kOp, " trans_a=", s.trans_a, " trans_b=", s.trans_b,
                                                " on ", device.str());
        auto measure = [&] {
          return weight_grad_gemm_check_error(s.trans_a, s.trans_b, device, [&](auto... args) {
            mixed_gemm_cuda(args..., stream);
          });
        };
        if (gpu_kernel_passes(key, kWeightGradGemmTolerance, measure,
                              "the bf16 GEMM's product (rounded to bf16 as before issue 34), "
                              "widened and added"))
          mixed_gemm_cuda(c, a, b, s, beta, stream);
        else
          bf16_product_added(c, a, b, s, beta, device, stream);
      });
}

} // namespace vlm::ops_detail
