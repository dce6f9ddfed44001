// CUDA elementwise, reduction, activation, cast and copy ops against the CPU ops on the same
// inputs, forward and backward. Every test skips (exit 77) with the device query text when there
// is no CUDA device.
//
// Error metric: max_rel_error (tests/gradcheck.h), max |gpu - cpu| / max |cpu| over the tensor.
// Tolerances:
//  - f32: 1e-5 for every op (fp32 arithmetic on both sides; the CUDA transcendental functions
//    are within 2 ulp, and sums are compared with an f64 reference on positive inputs, where the
//    CPU's sequential f32 sum would itself be off by more than 1e-5).
//  - bf16: 1e-2 for single ops (both sides compute in fp32 and round once to bf16, so outputs
//    differ by at most one bf16 ulp, 2^-8 relative to the largest value: 3.9e-3); 2e-2 for
//    gradients through a chain of bf16 ops (each step rounds again).
// Shapes are deliberately not multiples of the block (256) or pack (4 / 8) sizes, some views
// start at an odd element (so the 16-byte vector path cannot be used), and some have more than
// 65535 rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "src/core/ops.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"
#include "tests/skip.h"

using namespace vlm;
using testing::leaf;
using testing::max_rel_error;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

double tol_for(DType t, bool chain = false) {
  if (t == DType::f32) return 1e-5;
  return chain ? 2e-2 : 1e-2;
}

// Compares a CUDA result with the CPU result: same shape, dtype, device, relative error.
void check_close(const Tensor& g, const Tensor& c, double tol, const std::string& what) {
  INFO(what << ": gpu " << g.desc() << " cpu " << c.desc());
  REQUIRE(g.defined());
  REQUIRE(c.defined());
  CHECK(g.device() == kGpu);
  CHECK(g.dtype() == c.dtype());
  REQUIRE(g.shape() == c.shape());
  double err = max_rel_error(g.to_doubles(), c.to_doubles());
  INFO("max rel error " << err << " (tolerance " << tol << ")");
  CHECK(err <= tol);
}

Tensor randn(const Shape& s, Rng& rng, DType t, double std = 1.0) {
  return Tensor::randn(s, rng, t, std);
}

// Runs f on CPU leaves and on GPU copies of them, backpropagates the same random upstream
// gradient through both and compares the outputs and every input gradient.
void check_fwd_bwd(const std::vector<Tensor>& inputs,
                   const std::function<Tensor(const std::vector<Tensor>&)>& f, double tol,
                   double grad_tol, const std::string& what, uint64_t seed = 7) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    cpu_in.push_back(leaf(t));
    gpu_in.push_back(leaf(gpu(t)));
  }
  Tensor yc = f(cpu_in), yg = f(gpu_in);
  check_close(yg, yc, tol, what + " forward");
  Rng rng(seed);
  Tensor w = Tensor::randn(yc.shape(), rng, yc.dtype());
  sum(mul(yc, w)).backward();
  sum(mul(yg, gpu(w))).backward();
  for (size_t i = 0; i < inputs.size(); i++) {
    REQUIRE(gpu_in[i].grad().defined());
    check_close(gpu_in[i].grad(), cpu_in[i].grad(), grad_tol,
                what + " grad of input " + std::to_string(i));
  }
}

const DType kTypes[] = {DType::f32, DType::bf16};

} // namespace

TEST_CASE("gpu elementwise: add/sub/mul/div with broadcasting, forward and backward", "[gpu]") {
  require_device();
  Rng rng(1);
  struct Case {
    Shape a, b;
  };
  // Same shape (vector path), odd sizes, row and column broadcast, both sides broadcast, a
  // scalar, more than 65535 rows.
  const Case cases[] = {{{1000, 37}, {1000, 37}}, {{7, 5, 3}, {7, 5, 3}}, {{300, 129}, {129}},
                        {{129}, {300, 129}},      {{300, 1}, {300, 77}},  {{5, 1, 7}, {1, 6, 1}},
                        {{33, 17}, {}},           {{70001, 3}, {3}},      {{70001, 130}, {130}},
                        {{2, 3, 4, 5}, {3, 1, 5}}};
  for (DType dt : kTypes)
    for (const Case& c : cases) {
      Tensor a = randn(c.a, rng, dt);
      // Divisors away from 0 so the quotients stay moderate.
      Tensor b = Tensor::uniform(c.b, rng, 0.5, 2.0, dt);
      std::string shapes = shape_str(c.a) + " and " + shape_str(c.b) + " " + dtype_name(dt);
      double tol = tol_for(dt), gtol = tol_for(dt, true);
      check_fwd_bwd(
          {a, b}, [](auto& in) { return add(in[0], in[1]); }, tol, gtol, "add " + shapes);
      check_fwd_bwd(
          {a, b}, [](auto& in) { return sub(in[0], in[1]); }, tol, gtol, "sub " + shapes);
      check_fwd_bwd(
          {a, b}, [](auto& in) { return mul(in[0], in[1]); }, tol, gtol, "mul " + shapes);
      check_fwd_bwd(
          {a, b}, [](auto& in) { return div(in[0], in[1]); }, tol, gtol, "div " + shapes);
    }
}

TEST_CASE("gpu elementwise: strided and misaligned operands", "[gpu]") {
  require_device();
  Rng rng(2);
  for (DType dt : kTypes) {
    Tensor a = randn({64, 45}, rng, dt), b = randn({45, 64}, rng, dt);
    // A transposed operand goes through the general broadcast kernel.
    Tensor bt = transpose(b, 0, 1);
    check_close(add(gpu(a), transpose(gpu(b), 0, 1)), add(a, bt), tol_for(dt), "add transposed");
    // Views starting one element in: contiguous but not 16-byte aligned.
    Tensor x = randn({1001}, rng, dt), y = randn({1001}, rng, dt);
    Tensor xg = slice(gpu(x), 0, 1, 1001), yg = slice(gpu(y), 0, 1, 1001);
    check_close(mul(xg, yg), mul(slice(x, 0, 1, 1001), slice(y, 0, 1, 1001)), tol_for(dt),
                "mul misaligned");
    check_close(silu(xg), silu(slice(x, 0, 1, 1001)), tol_for(dt), "silu misaligned");
    check_close(affine(xg, 0.5, -2.0), affine(slice(x, 0, 1, 1001), 0.5, -2.0), tol_for(dt),
                "affine misaligned");
  }
}

TEST_CASE("gpu elementwise: affine, neg, scale and the in-place updates", "[gpu]") {
  require_device();
  Rng rng(3);
  for (DType dt : kTypes) {
    Tensor x = randn({257, 31}, rng, dt);
    check_fwd_bwd(
        {x}, [](auto& in) { return affine(in[0], -1.75, 0.25); }, tol_for(dt), tol_for(dt, true),
        std::string("affine ") + dtype_name(dt));
    check_close(neg(gpu(x)), neg(x), tol_for(dt), "neg");
    check_close(scale(gpu(x), 3.0), scale(x, 3.0), tol_for(dt), "scale");

    Tensor src = randn({257, 31}, rng, dt);
    Tensor c = x.clone(), g = gpu(x);
    add_(c, src, 0.3);
    add_(g, gpu(src), 0.3);
    check_close(g, c, tol_for(dt), "add_");
    scale_(c, -0.5);
    scale_(g, -0.5);
    check_close(g, c, tol_for(dt), "scale_");
    fill_(c, 1.25);
    fill_(g, 1.25);
    CHECK(g.to_doubles() == c.to_doubles());
  }
}

TEST_CASE("gpu reduce: sum and mean over all or some dims, against an f64 reference", "[gpu]") {
  require_device();
  Rng rng(4);
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  // Last dim (row kernel), first dim (column kernel), middle dims, several dims, everything,
  // long rows (split into chunks), many rows (> 65535), one big full reduction.
  const Case cases[] = {{{300, 77}, {1}},     {{300, 77}, {0}},       {{6, 50, 7}, {1}},
                        {{6, 50, 7}, {0, 2}}, {{5, 4, 3, 2}, {1, 3}}, {{9, 13}, {0, 1}},
                        {{3, 100003}, {1}},   {{70001, 5}, {1}},      {{100003, 3}, {0}},
                        {{1 << 20}, {0}},     {{2, 3, 1}, {2}},       {{40, 1, 33}, {0, 1}}};
  for (DType dt : kTypes)
    for (const Case& c : cases)
      for (bool keep : {false, true}) {
        // Positive values: no cancellation, so the relative error is that of the summation.
        Tensor x = Tensor::uniform(c.shape, rng, 0.5, 1.5, dt);
        Tensor ref_sum = sum(x.to(DType::f64), c.dims, keep);
        Tensor ref_mean = mean(x.to(DType::f64), c.dims, keep);
        INFO("over " << shape_str(c.shape) << " " << dtype_name(dt) << " keepdim " << keep);
        Tensor gs = sum(gpu(x), c.dims, keep), gm = mean(gpu(x), c.dims, keep);
        REQUIRE(gs.shape() == ref_sum.shape());
        CHECK(gs.dtype() == dt);
        CHECK(max_rel_error(gs.to_doubles(), ref_sum.to_doubles()) <= tol_for(dt));
        CHECK(max_rel_error(gm.to_doubles(), ref_mean.to_doubles()) <= tol_for(dt));
      }
  // Full reductions.
  for (DType dt : kTypes) {
    Tensor x = Tensor::uniform({1234, 567}, rng, 0.5, 1.5, dt);
    CHECK(max_rel_error(sum(gpu(x)).to_doubles(), sum(x.to(DType::f64)).to_doubles()) <=
          tol_for(dt));
    CHECK(max_rel_error(mean(gpu(x)).to_doubles(), mean(x.to(DType::f64)).to_doubles()) <=
          tol_for(dt));
  }
}

TEST_CASE("gpu reduce: sums are bitwise reproducible", "[gpu]") {
  require_device();
  Rng rng(5);
  Tensor x = gpu(randn({4097, 1531}, rng, DType::f32));
  for (auto dims : {std::vector<int64_t>{0}, std::vector<int64_t>{1}, std::vector<int64_t>{0, 1}}) {
    auto first = sum(x, dims).to_doubles();
    for (int rep = 0; rep < 3; rep++) CHECK(sum(x, dims).to_doubles() == first);
  }
}

TEST_CASE("gpu reduce: sum, mean and sum_to backward, permuted input", "[gpu]") {
  require_device();
  Rng rng(6);
  for (DType dt : kTypes) {
    // Mixed signs here, compared with the CPU op in the same dtype: the sums are short (<= 231
    // terms), so the CPU's sequential f32 sum is accurate to ~1e-6 of the largest output.
    double tol = tol_for(dt), gtol = tol_for(dt, true);
    Tensor x = randn({33, 65, 7}, rng, dt);
    check_fwd_bwd(
        {x}, [](auto& in) { return sum(in[0], {1}, true); }, tol, gtol, "sum dim 1");
    check_fwd_bwd(
        {x},
        [](auto& in) {
          return mean(in[0], {0, 2});
        },
        tol, gtol, "mean dims 0,2");
    check_fwd_bwd(
        {x},
        [](auto& in) {
          return sum_to(in[0], {65, 1});
        },
        tol, gtol, "sum_to");
    check_fwd_bwd(
        {x}, [](auto& in) { return sum(in[0]); }, tol, gtol, "sum all");
    // A permuted (non-contiguous) input.
    Tensor p = Tensor::uniform({20, 30, 40}, rng, 0.5, 1.5, dt);
    Tensor ref = sum(permute(p.to(DType::f64), {2, 0, 1}), {1});
    CHECK(max_rel_error(sum(permute(gpu(p), {2, 0, 1}), {1}).to_doubles(), ref.to_doubles()) <=
          tol_for(dt));
  }
}

TEST_CASE("gpu activation: every unary op, forward and backward", "[gpu]") {
  require_device();
  Rng rng(7);
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool positive; // needs x > 0
  };
  const Op ops[] = {
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, false},
      {"silu", [](const Tensor& x) { return silu(x); }, false},
      {"gelu erf", [](const Tensor& x) { return gelu(x, GeluApprox::none); }, false},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, false},
      {"exp", [](const Tensor& x) { return exp(x); }, false},
      {"log", [](const Tensor& x) { return log(x); }, true},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, true},
      {"square", [](const Tensor& x) { return square(x); }, false},
      {"softplus", [](const Tensor& x) { return softplus(x); }, false},
  };
  for (DType dt : kTypes)
    for (const Op& op : ops)
      for (const Shape& s : {Shape{3, 1001}, Shape{7}, Shape{70003}}) {
        Tensor x = op.positive ? Tensor::uniform(s, rng, 0.1, 4.0, dt) : randn(s, rng, dt, 3.0);
        check_fwd_bwd(
            {x}, [&](auto& in) { return op.f(in[0]); }, tol_for(dt), tol_for(dt, true),
            std::string(op.name) + " " + shape_str(s) + " " + dtype_name(dt));
      }
}

TEST_CASE("gpu activation: swiglu forward and backward, one or both grads", "[gpu]") {
  require_device();
  Rng rng(8);
  for (DType dt : kTypes)
    for (const Shape& s : {Shape{37, 1029}, Shape{5}, Shape{70001, 3}}) {
      Tensor gate = randn(s, rng, dt, 2.0), up = randn(s, rng, dt);
      std::string what = std::string("swiglu ") + shape_str(s) + " " + dtype_name(dt);
      check_fwd_bwd(
          {gate, up}, [](auto& in) { return swiglu(in[0], in[1]); }, tol_for(dt), tol_for(dt, true),
          what);
      // Only one input requires grad: the kernel skips the other output.
      Tensor gc = leaf(gate), gg = leaf(gpu(gate));
      Tensor w = randn(s, rng, dt);
      sum(mul(swiglu(gc, up), w)).backward();
      sum(mul(swiglu(gg, gpu(up)), gpu(w))).backward();
      check_close(gg.grad(), gc.grad(), tol_for(dt, true), what + " dgate only");
    }
}

TEST_CASE("gpu activation: softmax forward and backward, long and many rows", "[gpu]") {
  require_device();
  Rng rng(9);
  for (DType dt : kTypes)
    for (const Shape& s : {Shape{3, 5}, Shape{17, 1000}, Shape{4, 9001}, Shape{2, 3, 129},
                           Shape{70001, 33}, Shape{11}}) {
      Tensor x = randn(s, rng, dt, 4.0);
      check_fwd_bwd(
          {x}, [](auto& in) { return softmax(in[0]); }, tol_for(dt), tol_for(dt, true),
          std::string("softmax ") + shape_str(s) + " " + dtype_name(dt));
    }
}

TEST_CASE("gpu cast: f32 <-> bf16 <-> f64 and integers match the CPU cast", "[gpu]") {
  require_device();
  Rng rng(10);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(100003)}) {
    Tensor x = randn({n}, rng, DType::f32, 100.0);
    for (DType from : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64}) {
      Tensor src = x.to(from);
      for (DType to : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64}) {
        INFO("cast " << dtype_name(from) << " -> " << dtype_name(to) << " n " << n);
        Tensor g = gpu(src).to(to);
        CHECK(g.dtype() == to);
        CHECK(g.device() == kGpu);
        // Same conversion rules: bit-identical values.
        CHECK(g.to_doubles() == src.to(to).to_doubles());
      }
    }
    // Misaligned source and destination (a view one element in).
    Tensor v = slice(gpu(x), 0, n > 1 ? 1 : 0, n);
    CHECK(v.to(DType::bf16).to_doubles() ==
          slice(x, 0, n > 1 ? 1 : 0, n).to(DType::bf16).to_doubles());
  }
}

TEST_CASE("gpu cast: gradients flow through a cast", "[gpu]") {
  require_device();
  Rng rng(11);
  Tensor x = randn({129, 3}, rng, DType::f32);
  check_fwd_bwd(
      {x}, [](auto& in) { return square(in[0].to(DType::bf16)); }, 1e-2, 2e-2,
      "square of bf16 cast");
}

TEST_CASE("gpu copy: strided views become contiguous, copy_ into strided views", "[gpu]") {
  require_device();
  Rng rng(12);
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    Tensor x = randn({6, 7, 8, 9}, rng, DType::f32).to(dt);
    Tensor xg = gpu(x);
    auto check_view = [&](const std::function<Tensor(const Tensor&)>& view, const char* what) {
      INFO(what << " " << dtype_name(dt));
      Tensor g = view(xg).contiguous();
      CHECK(g.is_contiguous());
      CHECK(g.device() == kGpu);
      CHECK(g.to_doubles() == view(x).contiguous().to_doubles());
    };
    check_view([](const Tensor& t) { return transpose(t, 1, 2); }, "transpose");
    check_view([](const Tensor& t) { return permute(t, {3, 1, 0, 2}); }, "permute");
    check_view([](const Tensor& t) { return slice(t, 3, 2, 7); }, "slice last dim");
    check_view([](const Tensor& t) { return slice(transpose(t, 0, 3), 1, 1, 6); },
               "slice of transpose");
    check_view([](const Tensor& t) { return expand(slice(t, 0, 2, 3), {4, 7, 8, 9}); }, "expand");

    // copy_ into a strided destination, with a cast.
    Tensor dst_c = Tensor::zeros({9, 8, 7, 6}, dt), dst_g = Tensor::zeros({9, 8, 7, 6}, dt, kGpu);
    Tensor vc = permute(dst_c, {3, 2, 1, 0}), vg = permute(dst_g, {3, 2, 1, 0});
    copy_(vc, x.to(DType::f32));
    copy_(vg, xg.to(DType::f32));
    CHECK(dst_g.to_doubles() == dst_c.to_doubles());
  }
  // A large transpose with more than 65535 rows.
  Tensor big = randn({70001, 3}, rng, DType::bf16);
  CHECK(transpose(gpu(big), 0, 1).contiguous().to_doubles() ==
        transpose(big, 0, 1).contiguous().to_doubles());
}

TEST_CASE("gpu copy: slice, concat and permute backward run on the device", "[gpu]") {
  require_device();
  Rng rng(13);
  Tensor a = randn({5, 6, 7}, rng, DType::f32), b = randn({5, 3, 7}, rng, DType::f32);
  check_fwd_bwd(
      {a, b},
      [](auto& in) {
        Tensor c = concat({in[0], in[1]}, 1);
        return mul(permute(slice(c, 1, 2, 8), {2, 0, 1}), permute(slice(c, 1, 1, 7), {2, 0, 1}));
      },
      1e-5, 1e-5, "concat/slice/permute");
}

TEST_CASE("gpu: f64 tensors are rejected with a clear message", "[gpu]") {
  require_device();
  Tensor x = Tensor::ones({4}, DType::f64, kGpu);
  CHECK_THROWS_WITH(add(x, x), Catch::Contains("f32 or bf16") && Catch::Contains("f64"));
  CHECK_THROWS_WITH(silu(x), Catch::Contains("f32 or bf16"));
}

TEST_CASE("gpu: VLM_CHECK_FINITE=1 names the op that produced NaN or Inf", "[gpu]") {
  require_device();
  Tensor pos = gpu(Tensor::from_doubles({1, 2, 3, 4, 5}, {5}));
  Tensor mixed = gpu(Tensor::from_doubles({1, -2, 3, 4, 5}, {5}));
  Tensor zero = gpu(Tensor::from_doubles({1, 0, 3, 4, 5}, {5}));
  // Off (the default): NaN passes through silently.
  unsetenv("VLM_CHECK_FINITE");
  CHECK(std::isnan(log(mixed).to_doubles()[1]));
  setenv("VLM_CHECK_FINITE", "1", 1);
  CHECK_NOTHROW(log(pos));
  CHECK_NOTHROW(div(pos, pos));
  CHECK_THROWS_WITH(log(mixed), Catch::Contains("VLM_CHECK_FINITE") && Catch::Contains("log") &&
                                    Catch::Contains("1 NaN/Inf value"));
  CHECK_THROWS_WITH(div(pos, zero), Catch::Contains("div"));
  CHECK_THROWS_WITH(exp(affine(pos, 100.0)), Catch::Contains("exp"));
  // Each value is finite, the sum overflows.
  CHECK_THROWS_WITH(sum(Tensor::full({4}, 3e38, DType::f32, kGpu)), Catch::Contains("sum"));
  CHECK_THROWS_WITH(mean(Tensor::full({4}, 3e38, DType::f32, kGpu)), Catch::Contains("mean"));
  // bf16 and a large tensor with one bad element far from the start.
  Tensor big = Tensor::ones({1 << 20}, DType::bf16);
  Tensor bad = gpu(big);
  Tensor tail = slice(bad, 0, (1 << 20) - 1, 1 << 20);
  fill_(tail, 0.0);
  CHECK_THROWS_WITH(rsqrt(bad), Catch::Contains("rsqrt"));
  unsetenv("VLM_CHECK_FINITE");
  CHECK_NOTHROW(rsqrt(bad));
}
