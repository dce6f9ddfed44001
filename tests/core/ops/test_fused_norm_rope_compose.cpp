// The fused residual add + RMSNorm (add_rms_norm) and q/k RMSNorm + RoPE (rms_norm_rope) against
// the primitive op sequences they replace, on the CPU: add() then rms_norm /
// rms_norm_zero_centered, and the norm then rope(). Forward outputs and every input gradient must
// be BIT-identical (same formulas, same order, same T-roundings), in f32, f64 and bf16, for odd
// sizes, with and without a weight, plain and zero-centred, full and partial rotary, RoPE and MRoPE
// tables, and sizes large enough for the OpenMP paths (rows * dim > 32768) and several rows per dw
// row block. Also: the node names and the errors for bad input.
#include <string>

#include "src/core/ops/elementwise.h"
#include "src/core/ops/norm.h"
#include "src/core/ops/rope.h"
#include "src/core/ops/shape_ops.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"

using namespace vlm;
using vlm::testing::leaf;
using vlm::testing::same_bits;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, DType dt, double std = 1.0, double mean = 0.0) {
  Rng rng(seed);
  return Tensor::randn(s, rng, dt, std, mean);
}

// The norm variants of a decoder layer: no weight, plain (Qwen3) and zero-centred (Qwen3.5).
enum class W { none, scale, offset };

const char* w_name(W w) {
  return w == W::none ? "no weight" : w == W::scale ? "plain" : "zero-centred";
}

Tensor primitive_norm(const Tensor& x, const Tensor& w, W kind, double eps) {
  return kind == W::offset ? rms_norm_zero_centered(x, w, eps) : rms_norm(x, w, eps);
}

void check_bits(const char* what, const Tensor& got, const Tensor& want) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  CHECK(same_bits(got, want));
}

// add_rms_norm(x, h, w) vs (s = add(x, h), norm(s)): outputs, then backward from both outputs with
// the upstream gradients (gs, gy) -- as in a decoder layer, where the sum also feeds the next
// residual add -- and the gradients of x, h and w.
void compare_add_rms(DType dt, const Shape& shape, W kind, uint64_t seed) {
  INFO("add_rms_norm " << dtype_name(dt) << " " << shape_str(shape) << " " << w_name(kind));
  const int64_t dim = shape.back();
  const double eps = 1e-6;
  const Tensor x0 = rnd(shape, seed, dt), h0 = rnd(shape, seed + 1, dt, 0.5);
  const Tensor w0 = kind == W::none    ? Tensor()
                    : kind == W::scale ? rnd({dim}, seed + 2, dt, 0.2, 1.0)
                                       : rnd({dim}, seed + 2, dt, 0.2);
  const Tensor gs = rnd(shape, seed + 3, dt), gy = rnd(shape, seed + 4, dt);

  Tensor xf = leaf(x0), hf = leaf(h0), wf = w0.defined() ? leaf(w0) : Tensor();
  auto [sf, yf] = add_rms_norm(xf, hf, wf, eps, kind == W::offset);
  run_backward({sf, yf}, {gs, gy});

  Tensor xp = leaf(x0), hp = leaf(h0), wp = w0.defined() ? leaf(w0) : Tensor();
  Tensor sp = add(xp, hp);
  Tensor yp = primitive_norm(sp, wp, kind, eps);
  run_backward({sp, yp}, {gs, gy});

  check_bits("sum", sf, sp);
  check_bits("normed", yf, yp);
  check_bits("dx", xf.grad(), xp.grad());
  check_bits("dh", hf.grad(), hp.grad());
  if (w0.defined()) check_bits("dw", wf.grad(), wp.grad());
}

// rms_norm_rope(x, w, tables) vs rope(norm(x, w), tables): output, dx, dw.
void compare_norm_rope(DType dt, int64_t T, int64_t H, int64_t D, int64_t rotary, W kind,
                       bool mrope, uint64_t seed) {
  INFO("rms_norm_rope " << dtype_name(dt) << " T " << T << " H " << H << " D " << D << " rotary "
                        << rotary << " " << w_name(kind) << (mrope ? " mrope" : ""));
  const double eps = 1e-6;
  const Tensor x0 = rnd({T, H, D}, seed, dt, 1.0, 0.3);
  const Tensor w0 = kind == W::none    ? Tensor()
                    : kind == W::scale ? rnd({D}, seed + 1, dt, 0.2, 1.0)
                                       : rnd({D}, seed + 1, dt, 0.2);
  const Tensor gy = rnd({T, H, D}, seed + 2, dt);
  RopeTables tables;
  if (mrope) {
    // 3 rows of positions (t, h, w) that differ; sections sum to rotary / 2.
    std::vector<int64_t> pos(static_cast<size_t>(3 * T));
    for (int64_t a = 0; a < 3; a++)
      for (int64_t t = 0; t < T; t++) pos[size_t(a * T + t)] = (t * (a + 1) + 7 * a) % 97;
    const int64_t half = rotary / 2, s1 = half / 3, s2 = half / 3;
    tables =
        mrope_tables(Tensor::from_vector(pos, {3, T}), rotary, 1e6, {half - s1 - s2, s1, s2}, dt);
  } else {
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; t++) pos[size_t(t)] = (t * 13) % 50; // packed, restarting
    tables = rope_tables(Tensor::from_vector(pos, {T}), rotary, 1e6, dt);
  }

  Tensor xf = leaf(x0), wf = w0.defined() ? leaf(w0) : Tensor();
  Tensor yf = rms_norm_rope(xf, wf, eps, tables, kind == W::offset);
  run_backward({yf}, {gy});

  Tensor xp = leaf(x0), wp = w0.defined() ? leaf(w0) : Tensor();
  Tensor yp = rope(primitive_norm(xp, wp, kind, eps), tables);
  run_backward({yp}, {gy});

  check_bits("y", yf, yp);
  check_bits("dx", xf.grad(), xp.grad());
  if (w0.defined()) check_bits("dw", wf.grad(), wp.grad());
}

const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16};
const W kKinds[] = {W::none, W::scale, W::offset};

} // namespace

TEST_CASE("fused: add_rms_norm is bit-identical to add then rms_norm", "[compose]") {
  uint64_t seed = 10;
  for (DType dt : kDtypes)
    for (W kind : kKinds) {
      compare_add_rms(dt, {3, 5, 37}, kind, seed += 10); // odd sizes, a lane-sum tail
      compare_add_rms(dt, {1, 1}, kind, seed += 10);
      compare_add_rms(dt, {300, 131}, kind, seed += 10); // OpenMP, 3 rows per dw block
    }
}

TEST_CASE("fused: rms_norm_rope is bit-identical to rms_norm then rope", "[compose]") {
  uint64_t seed = 1000;
  for (DType dt : kDtypes)
    for (W kind : kKinds) {
      compare_norm_rope(dt, 5, 3, 38, 38, kind, false, seed += 10);  // full rotary, odd T, H
      compare_norm_rope(dt, 7, 2, 40, 10, kind, false, seed += 10);  // Qwen3.5's partial rotary
      compare_norm_rope(dt, 6, 3, 36, 36, kind, true, seed += 10);   // MRoPE tables
      compare_norm_rope(dt, 4, 1, 2, 2, kind, false, seed += 10);    // the smallest head
      compare_norm_rope(dt, 67, 9, 72, 72, kind, false, seed += 10); // OpenMP, dw row blocks
    }
}

TEST_CASE("fused: node names, and only some inputs requiring grad", "[compose]") {
  Tensor x = leaf(rnd({4, 6}, 1, DType::f32)), h = rnd({4, 6}, 2, DType::f32);
  Tensor w = leaf(rnd({6}, 3, DType::f32, 0.1, 1.0));
  auto [s, y] = add_rms_norm(x, h, w, 1e-6);
  REQUIRE(s.grad_fn());
  CHECK(std::string(s.grad_fn()->name()) == "AddRmsNormBackward");
  CHECK(y.grad_fn() == s.grad_fn());
  run_backward({y}, {Tensor::ones({4, 6})}); // the sum's gradient is zeros
  Tensor xp = leaf(x.detach()), wp = leaf(w.detach());
  run_backward({rms_norm(add(xp, h), wp, 1e-6)}, {Tensor::ones({4, 6})});
  CHECK(testing::max_rel_error(x.grad().to_doubles(), xp.grad().to_doubles()) == 0.0);
  CHECK(same_bits(w.grad(), wp.grad()));

  RopeTables t =
      rope_tables(Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3}), 4, 1e4, DType::f32);
  Tensor q = rnd({3, 2, 8}, 4, DType::f32), qw = leaf(rnd({8}, 5, DType::f32, 0.1, 1.0));
  Tensor r = rms_norm_rope(q, qw, 1e-6, t); // only the weight requires grad
  REQUIRE(r.grad_fn());
  CHECK(std::string(r.grad_fn()->name()) == "RmsNormRopeBackward");
  run_backward({r}, {Tensor::ones({3, 2, 8})});
  Tensor qwp = leaf(qw.detach());
  run_backward({rope(rms_norm(q, qwp, 1e-6), t)}, {Tensor::ones({3, 2, 8})});
  CHECK(same_bits(qw.grad(), qwp.grad()));
}

TEST_CASE("fused: bad input is reported with the shapes", "[compose]") {
  Tensor x = Tensor::zeros({2, 8}), w = Tensor::ones({8});
  CHECK_THROWS_WITH(add_rms_norm(x, Tensor::zeros({2, 7}), w, 1e-6),
                    Catch::Contains("add_rms_norm") && Catch::Contains("(2, 7)"));
  CHECK_THROWS_WITH(add_rms_norm(x, x, Tensor::ones({7}), 1e-6),
                    Catch::Contains("add_rms_norm") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(add_rms_norm(x, x.to(DType::f64), w, 1e-6), Catch::Contains("add_rms_norm"));
  RopeTables t =
      rope_tables(Tensor::from_vector(std::vector<int64_t>{0, 1}, {2}), 4, 1e4, DType::f32);
  Tensor q = Tensor::zeros({2, 3, 8});
  CHECK_THROWS_WITH(rms_norm_rope(q, Tensor::ones({6}), 1e-6, t),
                    Catch::Contains("rms_norm_rope") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(rms_norm_rope(Tensor::zeros({2, 8}), w, 1e-6, t),
                    Catch::Contains("rms_norm_rope"));
  CHECK_THROWS_WITH(rms_norm_rope(Tensor::zeros({3, 3, 8}), w, 1e-6, t),
                    Catch::Contains("rms_norm_rope") && Catch::Contains("tables"));
  CHECK_THROWS_WITH(rms_norm_rope(q, w, -1.0, t), Catch::Contains("eps"));
}
