// The measures of the fused norm kernels' first-use self-checks (src/core/ops/fused_norm_check.h)
// on the CPU, where the "kernels under test" are CPU stand-ins: the CPU kernels themselves measure
// zero (the buffers' placement, the NaN poisoning and the output list work, aligned and an
// element off); a one-rounding difference in every output passes the tolerance; and wrong kernels
// -- a dropped term, a wrong rotation, an ignored weight, a missed row, an unwritten dw -- fail it.
// The CUDA kernels themselves are checked in test_fused_norm_rope_gpu.cpp.
#include <catch2/catch.hpp>

#include <cmath>

#include "src/core/ops/elementwise.h"
#include "src/core/ops/fused_norm_check.h"

using namespace vlm;
using namespace vlm::ops_detail;
using kernels::RmsNormWeight;

namespace {

const Device kCpu = Device::cpu();
constexpr RmsNormWeight kModes[] = {RmsNormWeight::none, RmsNormWeight::scale,
                                    RmsNormWeight::offset};

// Moves every value of a contiguous float tensor by about one rounding of its dtype: one bf16
// ulp (2^-8..2^-7 relative), or 1e-6 relative in f32.
void nudge(const Tensor& t) {
  if (!t.defined()) return;
  if (t.dtype() == DType::bf16) {
    bf16* v = t.data<bf16>();
    for (int64_t i = 0; i < t.numel(); i++) v[i].bits = uint16_t(v[i].bits + 1);
  } else {
    float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); i++) v[i] *= 1.f + 1e-6f;
  }
}

// The first n rows of a [rows, ...] view or a [rows] statistic, as a kernel whose grid misses the
// rest would see them.
Tensor first_rows(const Tensor& t, int64_t n) {
  Shape shape = t.shape(), strides = t.strides();
  shape[0] = n;
  return t.as_strided(shape, strides, t.offset());
}

double add_error(DType dt, int64_t dim, RmsNormWeight mode, const AddRmsNormKernels& kernels) {
  return add_rms_norm_check_error(dt, dim, mode, kCpu, kernels);
}

double rope_error(DType dt, int64_t head_dim, int64_t rotary_dim, RmsNormWeight mode,
                  const RmsNormRopeKernels& kernels) {
  return rms_norm_rope_check_error(dt, head_dim, rotary_dim, mode, kCpu, kernels);
}

} // namespace

TEST_CASE("fused norm self-check: the CPU kernels measure zero against themselves") {
  for (DType dt : {DType::f32, DType::bf16})
    for (RmsNormWeight mode : kModes) {
      INFO(dtype_name(dt) << " mode " << int(mode));
      for (int64_t dim : {7, 64, 2048})
        CHECK(add_error(dt, dim, mode, run_add_rms_norm_kernels) == 0);
      CHECK(rope_error(dt, 128, 128, mode, run_rms_norm_rope_kernels) == 0);
      CHECK(rope_error(dt, 256, 64, mode, run_rms_norm_rope_kernels) == 0);
    }
}

TEST_CASE("fused norm self-check: one rounding off in every output passes the tolerance") {
  auto add_nudged = [](AddRmsNormProblem& p) {
    run_add_rms_norm_kernels(p);
    for (const Tensor& out : {p.s, p.y, p.ds, p.dw, p.rstd}) nudge(out);
  };
  auto rope_nudged = [](RmsNormRopeProblem& p) {
    run_rms_norm_rope_kernels(p);
    for (const Tensor& out : {p.y, p.dx, p.dw, p.rstd}) nudge(out);
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const double add = add_error(dt, 2048, RmsNormWeight::scale, add_nudged);
    const double rope = rope_error(dt, 128, 128, RmsNormWeight::offset, rope_nudged);
    CHECK(add > 0);
    CHECK(add <= fused_norm_tolerance(dt));
    CHECK(rope > 0);
    CHECK(rope <= fused_norm_tolerance(dt));
  }
}

TEST_CASE("fused norm self-check: wrong add_rms_norm kernels fail it") {
  // The backward without the sum's own gradient (ds_in).
  auto no_residual_grad = [](AddRmsNormProblem& p) {
    AddRmsNormProblem q = p; // the same output buffers
    q.ds_in = Tensor::zeros(p.ds_in.shape(), p.ds_in.dtype());
    run_add_rms_norm_kernels(q);
  };
  // The norm of x alone: the residual never added.
  auto no_residual = [](AddRmsNormProblem& p) {
    AddRmsNormProblem q = p;
    q.h = Tensor::zeros(p.h.shape(), p.h.dtype());
    run_add_rms_norm_kernels(q);
  };
  // A grid one row short.
  auto last_row_missed = [](AddRmsNormProblem& p) {
    AddRmsNormProblem q = p;
    for (Tensor* t : {&q.x, &q.h, &q.ds_in, &q.dy, &q.s, &q.y, &q.ds, &q.rstd})
      *t = first_rows(*t, t->size(0) - 1);
    run_add_rms_norm_kernels(q);
  };
  // dw never written.
  auto no_dw = [](AddRmsNormProblem& p) {
    AddRmsNormProblem q = p;
    q.dw = Tensor();
    run_add_rms_norm_kernels(q);
  };
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t dim : {64, 2048}) {
      INFO(dtype_name(dt) << " dim " << dim);
      const double tol = fused_norm_tolerance(dt);
      CHECK(add_error(dt, dim, RmsNormWeight::scale, no_residual_grad) > 10 * tol);
      CHECK(add_error(dt, dim, RmsNormWeight::none, no_residual) > 10 * tol);
      CHECK(std::isinf(add_error(dt, dim, RmsNormWeight::offset, last_row_missed)));
      CHECK(std::isinf(add_error(dt, dim, RmsNormWeight::scale, no_dw)));
    }
}

TEST_CASE("fused norm self-check: wrong rms_norm_rope kernels fail it") {
  // Rotating the other way.
  auto backwards_rotation = [](RmsNormRopeProblem& p) {
    RmsNormRopeProblem q = p;
    q.sin = neg(p.sin);
    run_rms_norm_rope_kernels(q);
  };
  // The weight ignored.
  auto unweighted = [](RmsNormRopeProblem& p) {
    RmsNormRopeProblem q = p;
    q.mode = RmsNormWeight::none;
    q.dw = Tensor();
    run_rms_norm_rope_kernels(q);
    fill_(p.dw, 0.0);
  };
  // No rotation at all.
  auto unrotated = [](RmsNormRopeProblem& p) {
    RmsNormRopeProblem q = p;
    q.shape.rotary_dim = q.shape.head_dim;
    q.cos = Tensor::ones({p.shape.tokens, p.shape.head_dim / 2}, p.cos.dtype());
    q.sin = Tensor::zeros({p.shape.tokens, p.shape.head_dim / 2}, p.sin.dtype());
    run_rms_norm_rope_kernels(q);
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const double tol = fused_norm_tolerance(dt);
    CHECK(rope_error(dt, 128, 128, RmsNormWeight::scale, backwards_rotation) > 10 * tol);
    CHECK(rope_error(dt, 256, 64, RmsNormWeight::scale, unweighted) > 10 * tol);
    CHECK(rope_error(dt, 256, 64, RmsNormWeight::none, unrotated) > 10 * tol);
  }
}
