// The fused add_rms_norm and rms_norm_rope on CUDA against the same ops on the CPU (which
// test_fused_norm_rope_compose.cpp holds bit-identical to the primitive sequences), forward and
// backward, f32 and bf16, plain / zero-centred / no weight, full and partial rotary, one and
// several warps per row, more than 65535 rows. Tolerances (relative max-norm) as for the unfused
// norms in test_norm_rope_index_gpu.cpp: f32 1e-5 (fp32 in another summation order; 3e-5 for dw
// over > 65535 rows), bf16 1e-2 (one rounding flip allowed where the fp32 values differ in the last
// bits). The ops run with VLM_GPU_SELF_CHECK=strict and must record the fused backward nodes, so a
// failed first-use check (src/core/ops/fused_norm_check.h) cannot hide behind the unfused
// fallback; the checks themselves must pass for the production shapes (Qwen3 hidden 1024-5120,
// head_dim 128; Qwen3.5 head_dim 256 with partial rotary 64, zero-centred); and once with
// =fallback the ops must run the unfused primitives and still match. Skips (exit 77) without a
// CUDA device.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "src/core/ops.h"
#include "src/core/ops/fused_norm_check.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;

namespace {

Tensor gpu_leaf(const Tensor& t) { return testing::leaf(t.detach().to(kGpu)); }

double tol(DType dt) { return dt == DType::bf16 ? 1e-2 : 1e-5; }

enum class W { none, scale, offset };

// Sets VLM_GPU_SELF_CHECK for the rest of the process (each TEST_CASE is its own process).
void self_check_mode(const char* value) { setenv("VLM_GPU_SELF_CHECK", value, 1); }

// Whether the GPU ops must take the fused kernels (strict mode) or the unfused primitives
// (fallback mode): told apart by the node that records the normed output.
bool g_expect_fused = true;

void check_node(const Tensor& y, const char* fused, const char* unfused) {
  REQUIRE(y.grad_fn());
  CHECK(std::string(y.grad_fn()->name()) == (g_expect_fused ? fused : unfused));
}

const char* unfused_norm_node(W kind) {
  return kind == W::offset ? "RmsNormZeroCenteredBackward" : "RmsNormBackward";
}

void compare_add_rms(DType dt, int64_t rows, int64_t dim, W kind, uint64_t seed) {
  INFO("add_rms_norm " << dtype_name(dt) << " rows " << rows << " dim " << dim << " kind "
                       << int(kind));
  Rng rng(seed);
  Tensor x = Tensor::randn({rows, dim}, rng, dt), h = Tensor::randn({rows, dim}, rng, dt, 0.5);
  Tensor w = kind == W::none ? Tensor() : Tensor::randn({dim}, rng, dt, 0.3);
  Tensor gs = Tensor::randn({rows, dim}, rng, dt), gy = Tensor::randn({rows, dim}, rng, dt);
  const bool zc = kind == W::offset;
  Tensor xc = testing::leaf(x), hc = testing::leaf(h), wc = w.defined() ? testing::leaf(w) : w;
  Tensor xg = gpu_leaf(x), hg = gpu_leaf(h), wg = w.defined() ? gpu_leaf(w) : w;
  auto [sc, yc] = add_rms_norm(xc, hc, wc, 1e-6, zc);
  auto [sg, yg] = add_rms_norm(xg, hg, wg, 1e-6, zc);
  CHECK(yg.device() == kGpu);
  check_node(yg, "AddRmsNormBackward", unfused_norm_node(kind));
  CHECK(testing::same_bits(sg, sc)); // one rounding of the same fp32 sum
  CHECK(rel_err(yg, yc) <= tol(dt));
  run_backward({sc, yc}, {gs, gy});
  run_backward({sg, yg}, {gpu(gs), gpu(gy)});
  CHECK(rel_err(xg.grad(), xc.grad()) <= tol(dt));
  CHECK(rel_err(hg.grad(), hc.grad()) <= tol(dt));
  const double param_tol = dt == DType::f32 && rows > 65535 ? 3e-5 : tol(dt);
  if (w.defined()) CHECK(rel_err(wg.grad(), wc.grad()) <= param_tol);
}

void compare_norm_rope(DType dt, int64_t T, int64_t H, int64_t D, int64_t R, W kind,
                       uint64_t seed) {
  INFO("rms_norm_rope " << dtype_name(dt) << " T " << T << " H " << H << " D " << D << " R " << R
                        << " kind " << int(kind));
  Rng rng(seed);
  Tensor x = Tensor::randn({T, H, D}, rng, dt, 1.0, 0.3);
  Tensor w = kind == W::none ? Tensor() : Tensor::randn({D}, rng, dt, 0.3);
  Tensor gy = Tensor::randn({T, H, D}, rng, dt);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; t++) pos[size_t(t)] = t % 1000;
  RopeTables tc = rope_tables(Tensor::from_vector(pos, {T}), R, 1e6, dt), tg;
  tg.cos = gpu(tc.cos); // the same tables on both sides
  tg.sin = gpu(tc.sin);
  tg.rotary_dim = R;
  const bool zc = kind == W::offset;
  Tensor xc = testing::leaf(x), wc = w.defined() ? testing::leaf(w) : w;
  Tensor xg = gpu_leaf(x), wg = w.defined() ? gpu_leaf(w) : w;
  Tensor yc = rms_norm_rope(xc, wc, 1e-6, tc, zc);
  Tensor yg = rms_norm_rope(xg, wg, 1e-6, tg, zc);
  CHECK(yg.device() == kGpu);
  check_node(yg, "RmsNormRopeBackward", "RopeBackward");
  CHECK(rel_err(yg, yc) <= tol(dt));
  yc.backward(gy);
  yg.backward(gpu(gy));
  CHECK(rel_err(xg.grad(), xc.grad()) <= tol(dt));
  const double param_tol = dt == DType::f32 && T * H > 65535 ? 3e-5 : tol(dt);
  if (w.defined()) CHECK(rel_err(wg.grad(), wc.grad()) <= param_tol);
}

} // namespace

TEST_CASE("gpu fused: add_rms_norm matches the CPU op (row layouts, weights)", "[gpu]") {
  require_device();
  self_check_mode("strict");
  uint64_t seed = 1;
  // 7, 1030: scalar loads; 64, 1024: one warp, vector loads; 2048: four warps; 5120: eight.
  for (DType dt : {DType::f32, DType::bf16})
    for (W kind : {W::none, W::scale, W::offset})
      for (int64_t dim : {7, 64, 1024, 1030, 2048, 5120})
        compare_add_rms(dt, dim >= 1024 ? 37 : 131, dim, kind, seed++);
  for (DType dt : {DType::f32, DType::bf16}) compare_add_rms(dt, 70001, 24, W::scale, 99);
}

TEST_CASE("gpu fused: rms_norm_rope matches the CPU op (partial rotary, many rows)", "[gpu]") {
  require_device();
  self_check_mode("strict");
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16})
    for (W kind : {W::none, W::scale, W::offset}) {
      compare_norm_rope(dt, 37, 3, 128, 128, kind, seed++); // Qwen3's head
      compare_norm_rope(dt, 19, 5, 256, 64, kind, seed++);  // Qwen3.5's partial rotary
      compare_norm_rope(dt, 11, 2, 38, 38, kind, seed++);   // odd pairs per lane
      compare_norm_rope(dt, 4, 1, 2, 2, kind, seed++);
    }
  for (DType dt : {DType::f32, DType::bf16}) compare_norm_rope(dt, 70001, 1, 8, 6, W::scale, 7);
}

TEST_CASE("gpu fused: the first-use checks pass for the production shapes", "[gpu]") {
  require_device();
  self_check_mode("strict"); // a failed check throws
  using kernels::RmsNormWeight;
  using namespace vlm::ops_detail;
  for (DType dt : {DType::f32, DType::bf16}) {
    const double tol = fused_norm_tolerance(dt);
    // Qwen3 0.6B-14B hidden sizes (one, four and eight warps a row; plain weight), Qwen3.5's
    // zero-centred norms.
    for (int64_t dim : {1024, 2048, 2560, 4096, 5120})
      for (RmsNormWeight mode : {RmsNormWeight::scale, RmsNormWeight::offset}) {
        INFO("add_rms_norm " << dtype_name(dt) << " dim " << dim << " mode " << int(mode));
        const double error =
            add_rms_norm_check_error(dt, dim, mode, kGpu, run_add_rms_norm_kernels);
        INFO("error " << error);
        CHECK(error <= tol);
        CHECK(add_rms_norm_cuda_passes(dt, dim, mode, kGpu));
      }
    struct Head {
      int64_t dim, rotary;
      RmsNormWeight mode;
    };
    // Qwen3 / Qwen3-VL q/k norms; Qwen3.5's partial rotary (a quarter of 256).
    for (const Head& head :
         {Head{128, 128, RmsNormWeight::scale}, Head{256, 64, RmsNormWeight::offset}}) {
      INFO("rms_norm_rope " << dtype_name(dt) << " head_dim " << head.dim << " rotary "
                            << head.rotary);
      const double error = rms_norm_rope_check_error(dt, head.dim, head.rotary, head.mode, kGpu,
                                                     run_rms_norm_rope_kernels);
      INFO("error " << error);
      CHECK(error <= tol);
      CHECK(rms_norm_rope_cuda_passes(dt, head.dim, head.rotary, head.mode, kGpu));
    }
  }
}

TEST_CASE("gpu fused: with the kernels ruled out the ops run the unfused primitives", "[gpu]") {
  require_device();
  self_check_mode("fallback");
  g_expect_fused = false;
  uint64_t seed = 500;
  // Shapes no other test case uses, so no decision cached in this process applies.
  for (DType dt : {DType::f32, DType::bf16})
    for (W kind : {W::none, W::scale, W::offset}) {
      compare_add_rms(dt, 29, 1536, kind, seed++);
      compare_norm_rope(dt, 9, 2, 64, 32, kind, seed++);
    }
  g_expect_fused = true;
}
