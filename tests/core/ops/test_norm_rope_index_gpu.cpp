// CUDA RMSNorm (none / scale / zero-centred / gated), LayerNorm, RoPE, embedding, index_select and
// index_add, forward and backward, each against the CPU op on the same inputs. Tolerances are
// relative max-norm errors (tests/gradcheck.h max_rel_error):
//   f32: 1e-5 (fp32 arithmetic in a different summation order; 3e-5 for parameter gradients
//        summed over > 65535 rows, where the CPU's and GPU's row-chunk orders differ most);
//   bf16: 1e-2 (the output is rounded to bf16 once, 2^-8 relative per step: a one-ulp flip where
//         the fp32 values differ in the last bits is allowed, two are not);
//   RoPE with the same tables, gathers and index_add: bit-identical (same operations, same order).
// Skips (exit 77) with the device query text when there is no CUDA device.
#include <catch2/catch.hpp>

#include <cstring>

#include "src/core/ops.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"
#include "tests/skip.h"

using namespace vlm;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

Tensor gpu_leaf(const Tensor& t) { return testing::leaf(t.detach().to(kGpu)); }

double tol(DType dt) { return dt == DType::bf16 ? 1e-2 : 1e-5; }

enum class Norm { rms_none, rms_scale, rms_offset, gated, gated_no_w, layer, layer_no_affine };

const char* norm_name(Norm n) {
  switch (n) {
  case Norm::rms_none: return "rms (no weight)";
  case Norm::rms_scale: return "rms (scale)";
  case Norm::rms_offset: return "rms (zero-centred)";
  case Norm::gated: return "gated";
  case Norm::gated_no_w: return "gated (no weight)";
  case Norm::layer: return "layer";
  case Norm::layer_no_affine: return "layer (no affine)";
  }
  return "?";
}

// Runs the norm on (x, z, w, b) (any of z, w, b may be undefined as the kind requires).
Tensor run_norm(Norm n, const Tensor& x, const Tensor& z, const Tensor& w, const Tensor& b) {
  switch (n) {
  case Norm::rms_none: return rms_norm(x, Tensor(), 1e-6);
  case Norm::rms_scale: return rms_norm(x, w, 1e-6);
  case Norm::rms_offset: return rms_norm_zero_centered(x, w, 1e-6);
  case Norm::gated: return rms_norm_gated(x, z, w, 1e-6);
  case Norm::gated_no_w: return rms_norm_gated(x, z, Tensor(), 1e-6);
  case Norm::layer: return layer_norm(x, w, b, 1e-5);
  case Norm::layer_no_affine: return layer_norm(x, Tensor(), Tensor(), 1e-5);
  }
  return Tensor();
}

bool uses_z(Norm n) { return n == Norm::gated || n == Norm::gated_no_w; }
bool uses_w(Norm n) {
  return n == Norm::rms_scale || n == Norm::rms_offset || n == Norm::gated || n == Norm::layer;
}
bool uses_b(Norm n) { return n == Norm::layer; }

// Forward and backward of one norm on CPU and GPU from the same inputs; checks y, dx, dz, dw, db.
void compare_norm(Norm n, DType dt, int64_t rows, int64_t dim, uint64_t seed) {
  INFO(norm_name(n) << " " << dtype_name(dt) << " rows " << rows << " dim " << dim);
  Rng rng(seed);
  Tensor x = Tensor::randn({rows, dim}, rng, dt);
  Tensor z = uses_z(n) ? Tensor::randn({rows, dim}, rng, dt) : Tensor();
  Tensor w = uses_w(n) ? Tensor::randn({dim}, rng, dt, 0.5) : Tensor();
  Tensor b = uses_b(n) ? Tensor::randn({dim}, rng, dt, 0.5) : Tensor();
  Tensor dy = Tensor::randn({rows, dim}, rng, dt);

  auto leaf_or = [](const Tensor& t, bool on_gpu) {
    if (!t.defined()) return Tensor();
    return on_gpu ? gpu_leaf(t) : testing::leaf(t);
  };
  Tensor xc = leaf_or(x, false), zc = leaf_or(z, false), wc = leaf_or(w, false),
         bc = leaf_or(b, false);
  Tensor xg = leaf_or(x, true), zg = leaf_or(z, true), wg = leaf_or(w, true), bg = leaf_or(b, true);
  Tensor yc = run_norm(n, xc, zc, wc, bc);
  Tensor yg = run_norm(n, xg, zg, wg, bg);
  CHECK(yg.device() == kGpu);
  CHECK(rel_err(yg, yc) <= tol(dt));
  yc.backward(dy);
  yg.backward(gpu(dy));
  const double param_tol = dt == DType::f32 && rows > 65535 ? 3e-5 : tol(dt);
  CHECK(rel_err(xg.grad(), xc.grad()) <= tol(dt));
  if (z.defined()) CHECK(rel_err(zg.grad(), zc.grad()) <= tol(dt));
  if (w.defined()) CHECK(rel_err(wg.grad(), wc.grad()) <= param_tol);
  if (b.defined()) CHECK(rel_err(bg.grad(), bc.grad()) <= param_tol);
}

const Norm kAllNorms[] = {Norm::rms_none,   Norm::rms_scale, Norm::rms_offset,     Norm::gated,
                          Norm::gated_no_w, Norm::layer,     Norm::layer_no_affine};

} // namespace

TEST_CASE("gpu norms: forward and backward match the CPU ops, all modes and row layouts", "[gpu]") {
  require_device();
  // dim 3, 7, 1030 (odd sizes: scalar loads), 64, 72, 1024 (one warp per row, vector loads),
  // 2048 (four warps per row), 4100 (eight warps, scalar loads in bf16), 5120 and 8192 (eight
  // warps, vector loads: the hidden sizes of Qwen3-14B/32B and of the largest models), rows not
  // multiples of the rows per block. (No dim 1: there an RMSNorm's dx is eps/(x^2 + eps) times
  // rounding noise on both sides.)
  const int64_t dims[] = {3, 7, 64, 72, 1024, 1030, 2048, 4100, 5120, 8192};
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16})
    for (Norm n : kAllNorms)
      for (int64_t dim : dims) compare_norm(n, dt, dim >= 1024 ? 37 : 131, dim, seed++);
}

TEST_CASE("gpu norms: more than 65535 rows (grid-stride rows, chunked dw/db)", "[gpu]") {
  require_device();
  for (DType dt : {DType::f32, DType::bf16}) {
    compare_norm(Norm::rms_scale, dt, 70001, 24, 11);
    compare_norm(Norm::gated, dt, 66000, 16, 12);
    compare_norm(Norm::layer, dt, 65537, 40, 13);
  }
}

TEST_CASE("gpu norms: unaligned rows take the scalar path and still match", "[gpu]") {
  require_device();
  // x starts 1 element into its storage: every row is misaligned for 16-byte loads although dim
  // is a multiple of the vector width.
  for (DType dt : {DType::f32, DType::bf16}) {
    Rng rng(21);
    const int64_t rows = 19, dim = 64;
    Tensor flat = Tensor::randn({rows * dim + 1}, rng, dt);
    Tensor w = Tensor::randn({dim}, rng, dt, 0.5);
    Tensor xc = reshape(slice(flat, 0, 1, rows * dim + 1), {rows, dim});
    Tensor xg = reshape(slice(gpu(flat), 0, 1, rows * dim + 1), {rows, dim});
    CHECK(rel_err(rms_norm(xg, gpu(w), 1e-6), rms_norm(xc, w, 1e-6)) <= tol(dt));
    CHECK(rel_err(layer_norm(xg, gpu(w), gpu(w), 1e-5), layer_norm(xc, w, w, 1e-5)) <= tol(dt));
  }
}

TEST_CASE("gpu norms: parameter gradients are bit-identical run to run", "[gpu]") {
  require_device();
  Rng rng(31);
  Tensor x = Tensor::randn({5000, 96}, rng), w = Tensor::randn({96}, rng),
         dy = Tensor::randn({5000, 96}, rng);
  Tensor first;
  for (int rep = 0; rep < 3; rep++) {
    Tensor wg = gpu_leaf(w);
    layer_norm(gpu(x), wg, Tensor(), 1e-5).backward(gpu(dy));
    if (rep == 0)
      first = wg.grad();
    else
      CHECK(same_bits(wg.grad(), first));
  }
}

TEST_CASE("gpu norms: f64 CUDA tensors are rejected with a clear message", "[gpu]") {
  require_device();
  Tensor x = gpu(Tensor::zeros({2, 4}, DType::f64));
  CHECK_THAT(testing::error_of([&] { rms_norm(x, Tensor(), 1e-6); }),
             Catch::Contains("f64 runs on CPU only"));
}

TEST_CASE("gpu rope: tables, forward and backward match the CPU op (partial rotary, i32/i64)",
          "[gpu]") {
  require_device();
  Rng rng(41);
  struct Case {
    int64_t tokens, heads, head_dim, rotary_dim;
  };
  const Case cases[] = {{1, 1, 2, 2},     {37, 3, 64, 64},  {300, 5, 128, 128},
                        {70, 4, 256, 64}, {129, 2, 80, 20}, {70000, 1, 8, 6}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " T " << c.tokens << " H " << c.heads << " D " << c.head_dim << " R "
                          << c.rotary_dim);
      // Positions restart per packed document and reach 40000 (large angles).
      std::vector<int64_t> pos(size_t(c.tokens));
      for (int64_t t = 0; t < c.tokens; t++) pos[size_t(t)] = t % 1000 == 999 ? 40000 : t % 1000;
      Tensor pos64 = Tensor::from_vector(pos, {c.tokens});
      Tensor pos32 = pos64.to(DType::i32);
      RopeTables tc = rope_tables(pos64, c.rotary_dim, 1e6, dt);
      for (const Tensor& p : {pos64, pos32}) {
        RopeTables tg = rope_tables(gpu(p), c.rotary_dim, 1e6, dt);
        CHECK(tg.cos.device() == kGpu);
        // cos/sin: CUDA's cosf/sinf are within 2 ulp of the host's, before rounding to dt.
        CHECK(rel_err(tg.cos, tc.cos) <= (dt == DType::bf16 ? 8e-3 : 1e-6));
        CHECK(rel_err(tg.sin, tc.sin) <= (dt == DType::bf16 ? 8e-3 : 1e-6));
      }
      // The rotation itself from the same tables: bit-identical, forward and backward.
      RopeTables same;
      same.cos = gpu(tc.cos);
      same.sin = gpu(tc.sin);
      same.rotary_dim = c.rotary_dim;
      Tensor x = Tensor::randn({c.tokens, c.heads, c.head_dim}, rng, dt);
      Tensor dy = Tensor::randn({c.tokens, c.heads, c.head_dim}, rng, dt);
      Tensor xc = testing::leaf(x), xg = gpu_leaf(x);
      Tensor yc = rope(xc, tc), yg = rope(xg, same);
      CHECK(same_bits(yg, yc));
      yc.backward(dy);
      yg.backward(gpu(dy));
      CHECK(same_bits(xg.grad(), xc.grad()));
    }
  }
}

TEST_CASE("gpu mrope: tables from [3, T] position ids match the CPU op (i32/i64)", "[gpu]") {
  require_device();
  // Three different rows (t, h, w as for an image) with the released models' section layout.
  const int64_t tokens = 300;
  std::vector<int64_t> pos(3 * tokens);
  for (int64_t t = 0; t < tokens; t++) {
    pos[size_t(t)] = t % 97;
    pos[size_t(tokens + t)] = t % 97 + t % 7;
    pos[size_t(2 * tokens + t)] = t % 97 + t % 11;
  }
  const Tensor pos64 = Tensor::from_vector(pos, {3, tokens});
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const RopeTables tc = mrope_tables(pos64, 128, 5e6, {24, 20, 20}, dt);
    for (const Tensor& p : {pos64, pos64.to(DType::i32)}) {
      const RopeTables tg = mrope_tables(gpu(p), 128, 5e6, {24, 20, 20}, dt);
      CHECK(tg.cos.device() == kGpu);
      CHECK(rel_err(tg.cos, tc.cos) <= (dt == DType::bf16 ? 8e-3 : 1e-6));
      CHECK(rel_err(tg.sin, tc.sin) <= (dt == DType::bf16 ? 8e-3 : 1e-6));
    }
  }
}

TEST_CASE("gpu embedding / index_select / index_add match the CPU ops bit for bit", "[gpu]") {
  require_device();
  Rng rng(51);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (DType it : {DType::i32, DType::i64}) {
      INFO(dtype_name(dt) << " ids " << dtype_name(it));
      // Embedding: vocab 1000, hidden 72, 5000 ids with heavy repeats (id 3 about a third of them).
      const int64_t vocab = 1000, hidden = 72, n = 5000;
      std::vector<int64_t> ids(n);
      for (int64_t j = 0; j < n; j++) ids[size_t(j)] = j % 3 == 0 ? 3 : rng.randint(0, vocab);
      Tensor idc = Tensor::from_vector(ids, {50, 100}).to(it);
      Tensor w = Tensor::randn({vocab, hidden}, rng, dt);
      Tensor dy = Tensor::randn({50, 100, hidden}, rng, dt);
      Tensor wc = testing::leaf(w), wg = gpu_leaf(w);
      Tensor yc = embedding(wc, idc), yg = embedding(wg, gpu(idc));
      CHECK(same_bits(yg, yc));
      yc.backward(dy);
      yg.backward(gpu(dy));
      CHECK(same_bits(wg.grad(), wc.grad()));

      // index_select / index_add along a middle dim, inner size not a multiple of a block.
      Tensor x = Tensor::randn({3, 40, 33}, rng, dt);
      std::vector<int64_t> idx = {5, 0, 39, 5, 5, 17, 0, 22};
      Tensor ic = Tensor::from_vector(idx, {8}).to(it);
      Tensor xc = testing::leaf(x), xg = gpu_leaf(x);
      Tensor sc_ = index_select(xc, 1, ic), sg = index_select(xg, 1, gpu(ic));
      CHECK(same_bits(sg, sc_));
      Tensor ds = Tensor::randn({3, 8, 33}, rng, dt);
      sc_.backward(ds);
      sg.backward(gpu(ds));
      CHECK(same_bits(xg.grad(), xc.grad()));

      Tensor src = Tensor::randn({3, 8, 33}, rng, dt);
      Tensor srcc = testing::leaf(src), srcg = gpu_leaf(src);
      Tensor ac = index_add(x, 1, ic, srcc), ag = index_add(gpu(x), 1, gpu(ic), srcg);
      CHECK(same_bits(ag, ac));
      Tensor da = Tensor::randn({3, 40, 33}, rng, dt);
      ac.backward(da);
      ag.backward(gpu(da));
      CHECK(same_bits(srcg.grad(), srcc.grad()));
    }
  }
}

TEST_CASE("gpu index_add: 70000 sources into few rows, deterministic and equal to CPU", "[gpu]") {
  require_device();
  Rng rng(61);
  const int64_t n = 70000, rows = 300, inner = 5;
  std::vector<int64_t> idx(n);
  for (int64_t j = 0; j < n; j++) idx[size_t(j)] = rng.randint(0, rows);
  Tensor ic = Tensor::from_vector(idx, {n});
  Tensor x = Tensor::randn({rows, inner}, rng), src = Tensor::randn({n, inner}, rng);
  Tensor want = index_add(x, 0, ic, src);
  Tensor got1 = index_add(gpu(x), 0, gpu(ic), gpu(src));
  Tensor got2 = index_add(gpu(x), 0, gpu(ic), gpu(src));
  CHECK(same_bits(got1, want));
  CHECK(same_bits(got2, got1));
}

TEST_CASE("gpu index ops: an out-of-range index names its position and value", "[gpu]") {
  require_device();
  // Checked on the device without a synchronization: reported at the next host read
  // (tests/core/test_streams_gpu.cpp covers the record itself).
  Tensor w = gpu(Tensor::zeros({10, 4}));
  Tensor ids = gpu(Tensor::from_vector(std::vector<int64_t>{1, 2, 10, 3}, {2, 2}));
  std::string msg = testing::error_of([&] { embedding(w, ids).to(Device::cpu()); });
  CHECK_THAT(msg, Catch::Contains("(1, 0)") && Catch::Contains("10"));
  Tensor neg = gpu(Tensor::from_vector(std::vector<int32_t>{0, -1}, {2}));
  CHECK_THAT(testing::error_of([&] { index_select(w, 0, neg).to_doubles(); }),
             Catch::Contains("-1"));
  Tensor src = gpu(Tensor::ones({2, 4}));
  CHECK_THAT(testing::error_of([&] { index_add(w, 0, neg, src).to_doubles(); }),
             Catch::Contains("index_add") && Catch::Contains("-1"));
}
