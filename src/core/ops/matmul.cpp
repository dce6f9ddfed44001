#include "src/core/ops/matmul.h"

#include <algorithm>
#include <type_traits>

#include "kernels/gemm.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/ops/weight_grad_gemm.h"

namespace vlm {

using namespace ops_detail;
using kernels::cpu::GemmShape;

namespace {

thread_local LinearInterceptor* t_linear_interceptor = nullptr;

// c = op(a) op(b) + beta * c on contiguous tensors of one device: a and b of one dtype, c of
// theirs, or f32 for bf16 a and b (weight gradients into an fp32 .grad, accumulate_weight_grad).
// On CUDA through cuBLASLt (kernels/gemm.h): fp32 accumulation, each output rounded to c's dtype
// once; the mixed product through weight_grad_gemm, which checks that call at first use.
void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmShape& s, float beta = 0.f) {
  if (c.dtype() != a.dtype()) {
    VLM_CHECK(a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && c.dtype() == DType::f32,
              "matmul: a mixed-precision product takes bf16 inputs into an f32 output, got ",
              describe("a", a), ", ", describe("b", b), ", ", describe("c", c));
    weight_grad_gemm(c.data<float>(), a.data<bf16>(), b.data<bf16>(), s, beta, a.device());
    return;
  }
  dispatch(
      "matmul", a.device(), a.dtype(),
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::gemm<T>(c.data<T>(), a.data<T>(), b.data<T>(), s, 1.f, beta);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        const auto type =
            std::is_same_v<T, float> ? kernels::cuda::GemmType::f32 : kernels::cuda::GemmType::bf16;
        kernels::cuda::gemm(c.data_ptr(), type, a.data_ptr(), b.data_ptr(), type, s.M, s.N, s.K,
                            s.trans_a, s.trans_b, 1.f, beta, s.batch, s.stride_a, s.stride_b,
                            s.stride_c, stream);
      });
}

GemmShape mm(int64_t M, int64_t N, int64_t K, bool ta = false, bool tb = false) {
  GemmShape s;
  s.M = M;
  s.N = N;
  s.K = K;
  s.trans_a = ta;
  s.trans_b = tb;
  return s;
}

// A weight gradient written straight into `acc` (accumulate_weight_grad). Added (beta = 1) to one
// of its own dtype already there (FSDP's gradient buffer of an f32 unit): the product on its own,
// then the sum, which is what autograd's sum of two gradients gives (a GEMM accumulating into
// acc rounds otherwise). Into an f32 buffer of a bf16 weight: the GEMM accumulates, as always.
void write_weight_grad(Tensor& acc, const Tensor& a, const Tensor& b, const GemmShape& s,
                       float beta) {
  if (beta == 0.f || acc.dtype() != a.dtype()) return gemm(acc, a, b, s, beta);
  Tensor product = Tensor::empty(acc.shape(), acc.dtype(), acc.device());
  gemm(product, a, b, s, 0.f);
  add_(acc, product);
}

struct MatmulBackward final : Node {
  Tensor a, b; // contiguous
  const char* name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0].contiguous();
    int64_t K = a.shape().back(), N = b.shape().back();
    int64_t M = a.shape()[a.dim() - 2];
    Tensor ga, gb;
    if (b.dim() == 2) {
      int64_t rows = a.numel() / K; // fold the batch into M
      if (needs_input_grad(0)) {
        ga = Tensor::empty(a.shape(), a.dtype(), a.device());
        gemm(ga, g, b, mm(rows, K, N, false, true)); // g [rows,N] · b^T
      }
      if (needs_input_grad(1)) {
        const GemmShape s = mm(K, N, rows, true, false); // a^T [K,rows] · g
        auto write = [&](Tensor& acc, float beta) { write_weight_grad(acc, a, g, s, beta); };
        if (!accumulate_weight_grad(next_edges[1], write)) {
          gb = Tensor::empty(b.shape(), b.dtype(), b.device());
          write(gb, 0.f);
        }
      }
    } else {
      int64_t batch = a.numel() / (M * K);
      if (needs_input_grad(0)) {
        ga = Tensor::empty(a.shape(), a.dtype(), a.device());
        GemmShape s = mm(M, K, N, false, true);
        s.batch = batch;
        s.stride_a = M * N;
        s.stride_b = K * N;
        s.stride_c = M * K;
        gemm(ga, g, b, s);
      }
      if (needs_input_grad(1)) {
        gb = Tensor::empty(b.shape(), b.dtype(), b.device());
        GemmShape s = mm(K, N, M, true, false);
        s.batch = batch;
        s.stride_a = M * K;
        s.stride_b = M * N;
        s.stride_c = K * N;
        gemm(gb, a, g, s);
      }
    }
    return {ga, gb};
  }
  void release() override { a = b = Tensor(); }
};

struct LinearBackward final : Node {
  Tensor x2, w; // x as [rows, in], contiguous
  Shape x_shape;
  bool has_bias = false;
  const char* name() const override { return "LinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    int64_t rows = x2.shape()[0], in = x2.shape()[1], out = w.shape()[0];
    Tensor g = reshape(grads[0].contiguous(), {rows, out});
    Tensor gx, gw, gbias;
    if (needs_input_grad(0)) {
      gx = Tensor::empty({rows, in}, x2.dtype(), x2.device());
      gemm(gx, g, w, mm(rows, in, out)); // g · w
      gx = reshape(gx, x_shape);
    }
    // A bf16 weight or bias with an f32 .grad gets its gradient in f32 straight from the GEMM,
    // added into .grad (accumulate_weight_grad); anything else gets it returned in its dtype.
    if (needs_input_grad(1)) {
      const GemmShape s = mm(out, in, rows, true, false); // g^T · x
      auto write = [&](Tensor& acc, float beta) { write_weight_grad(acc, g, x2, s, beta); };
      if (!accumulate_weight_grad(next_edges[1], write)) {
        gw = Tensor::empty(w.shape(), w.dtype(), w.device());
        write(gw, 0.f);
      }
    }
    if (has_bias && needs_input_grad(2)) {
      // The column sums of g as the product ones[1, rows] · g, so that they too reach .grad
      // unrounded.
      auto write = [&](Tensor& acc, float beta) {
        write_weight_grad(acc, Tensor::ones({rows}, g.dtype(), g.device()), g, mm(1, out, rows),
                          beta);
      };
      if (!accumulate_weight_grad(next_edges[2], write)) gbias = sum(g, {0});
    }
    return {gx, gw, gbias};
  }
  void release() override { x2 = w = Tensor(); }
};

} // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_float("matmul", "a", a_in);
  check_float("matmul", "b", b_in);
  check_same_dtype("matmul", "a", a_in, "b", b_in);
  check_same_device("matmul", "a", a_in, "b", b_in);
  VLM_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2, "matmul: both operands need >= 2 dims, got ",
            describe("a", a_in), ", ", describe("b", b_in));
  int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  VLM_CHECK(b_in.size(-2) == K, "matmul: inner dims differ, ", describe("a", a_in), " vs ",
            describe("b", b_in));
  if (b_in.dim() > 2) {
    bool same_batch = a_in.dim() == b_in.dim();
    for (int64_t d = 0; same_batch && d < a_in.dim() - 2; d++)
      same_batch = a_in.shape()[d] == b_in.shape()[d];
    VLM_CHECK(same_batch, "matmul: batch dims differ, ", describe("a", a_in), " vs ",
              describe("b", b_in));
  }
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Shape out_shape = a.shape();
  out_shape.back() = N;
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  if (b.dim() == 2) {
    gemm(out, a, b, mm(a.numel() / K, N, K));
  } else {
    GemmShape s = mm(M, N, K);
    s.batch = a.numel() / (M * K);
    s.stride_a = M * K;
    s.stride_b = K * N;
    s.stride_c = M * N;
    gemm(out, a, b, s);
  }
  if (needs_grad({&a_in, &b_in})) {
    auto node = std::make_shared<MatmulBackward>();
    node->a = a.detach();
    node->b = b.detach();
    record(node, {&a_in, &b_in}, {&out});
  }
  return out;
}

LinearInterceptScope::LinearInterceptScope(LinearInterceptor* interceptor)
    : previous_(t_linear_interceptor) {
  t_linear_interceptor = interceptor;
}

LinearInterceptScope::~LinearInterceptScope() { t_linear_interceptor = previous_; }

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (LinearInterceptor* interceptor = t_linear_interceptor) {
    LinearInterceptScope plain(nullptr);
    return interceptor->linear(x, w, bias);
  }
  check_float("linear", "x", x);
  check_float("linear", "w", w);
  check_same_dtype("linear", "x", x, "w", w);
  check_same_device("linear", "x", x, "w", w);
  VLM_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), "linear: ", describe("x", x),
            " does not fit ", describe("w", w), " (w is [out, in], x is [..., in])");
  int64_t in = w.size(1), out_f = w.size(0), rows = x.numel() / std::max<int64_t>(in, 1);
  if (bias.defined()) {
    check_same_dtype("linear", "x", x, "bias", bias);
    VLM_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear: ", describe("bias", bias),
              " does not fit ", describe("w", w));
  }
  Tensor x2 = x.contiguous(), wc = w.contiguous();
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  float beta = 0.f;
  if (bias.defined()) { // start from the broadcast bias and accumulate the product onto it
    check_same_device("linear", "x", x, "bias", bias);
    NoGradGuard no_grad;
    Tensor view = reshape(out, {rows, out_f});
    copy_(view, expand(bias, {rows, out_f}));
    beta = 1.f;
  }
  gemm(out, x2, wc, mm(rows, out_f, in, false, true), beta);
  return linear_from_output(x, w, bias, out);
}

Tensor linear_from_output(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  Tensor out = y.detach();
  if (needs_grad({&x, &w, &bias})) {
    const int64_t in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
    Tensor x2 = x.contiguous();
    auto node = std::make_shared<LinearBackward>();
    node->x2 = x2.detach().as_strided({rows, in}, {in, 1}, x2.offset());
    node->w = w.contiguous().detach();
    node->x_shape = x.shape();
    node->has_bias = bias.defined();
    record(node, {&x, &w, &bias}, {&out}); // an undefined bias gets an empty edge
  }
  return out;
}

} // namespace vlm
