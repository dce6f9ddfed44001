// Varlen attention on CUDA: the own flash kernels (the op's f32 path, and its bf16 path where
// cuDNN does not run; VLM_ATTENTION_BACKEND=own here) against the CPU op and against
// the reference CUDA kernels, forward (out, lse) and backward (dq, dk, dv), for head dims
// 64/72/80/128/256, documents of 1, 63, 0 (empty), 64, 65 and 300 tokens packed in one row, GQA
// ratios 1/2/4, causal and bidirectional, f32 and bf16.
// bf16 runs on tensor cores (P and dS rounded to bf16 as matrix operands); the bf16 SIMT
// kernels (VLM_ATTENTION_SIMT=1) are checked too.
// Tolerances (max-norm relative error, max|got - want| / max|want|):
//  * f32: 1e-5 everywhere (fp32 arithmetic on both sides; the online softmax and the summation
//    order are the only differences);
//  * bf16, same bf16 inputs on both sides: forward 1e-2 (each output rounded once, about one
//    bf16 rounding 2^-8 apart, plus P rounded to bf16 on tensor cores); backward 2e-2 (dS is a
//    bf16 operand on tensor cores, and through the op each side rounds its own forward output,
//    which enters delta = dO·O). A CPU emulation of the kernels measured at most 5e-3 forward
//    and 7e-3 backward on these cases (the bounds are 2x and 2.9x that).
// The kernel-level outputs are poisoned with NaN before the kernels write them
// (tests/gpu_testing.h), so a row or head a kernel skips fails instead of passing with a
// previous launch's values. A bf16 case with documents of 2048 and more tokens (many key tiles,
// a long online softmax) runs the same checks.
// Skips (exit 77) with the device query text when there is no device.
#include <catch2/catch.hpp>

#include "tests/skip.h"

#if VLM_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gpu_runtime.h"
#include "src/core/ops.h"
#include "src/core/ops/attention.h"
#include "src/core/varlen.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"

using namespace vlm;
namespace kc = vlm::kernels::cuda;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.to(Device::cpu()).to_doubles() == b.to(Device::cpu()).to_doubles();
}

Tensor offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t len : lengths) cu.push_back(cu.back() + len);
  return Tensor::from_vector(cu, {int64_t(cu.size())});
}

struct Case {
  int64_t Hq, Hkv, D;
  bool causal;
  DType dtype;
  std::vector<int32_t> lengths;
};

std::string describe_case(const Case& c) {
  std::ostringstream os;
  os << dtype_name(c.dtype) << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
     << (c.causal ? " causal" : " bidirectional") << " lengths";
  for (int32_t len : c.lengths) os << ' ' << len;
  return os.str();
}

kernels::AttentionShape shape_of(const Case& c, int64_t T, double scale) {
  kernels::AttentionShape s;
  s.tokens = T;
  s.q_heads = c.Hq;
  s.kv_heads = c.Hkv;
  s.head_dim = c.D;
  s.docs = int64_t(c.lengths.size());
  s.causal = c.causal;
  s.scale = scale;
  return s;
}

// The flash kernels through the op and at the kernel level, against the CPU op and the
// reference kernels.
template <typename E> void check_case(const Case& c, uint64_t seed) {
  INFO(describe_case(c));
  // The own kernels, also for bf16 (where the op would take cuDNN's fused attention: that has
  // its own test, test_attention_cudnn_gpu.cpp).
  setenv("VLM_ATTENTION_BACKEND", "own", 1);
  const DType dt = c.dtype;
  const double tol_fwd = dt == DType::f32 ? 1e-5 : 1e-2;
  const double tol_bwd_op = dt == DType::f32 ? 1e-5 : 2e-2;
  const double tol_bwd_kernel = dt == DType::f32 ? 1e-5 : 2e-2;
  Tensor cu = offsets(c.lengths);
  const int64_t T = int64_t(cu.to_doubles().back());
  const double scale = 1.0 / std::sqrt(double(c.D));
  Rng rng(seed);
  Tensor q = Tensor::randn({T, c.Hq, c.D}, rng, dt).set_requires_grad(true);
  Tensor k = Tensor::randn({T, c.Hkv, c.D}, rng, dt).set_requires_grad(true);
  Tensor v = Tensor::randn({T, c.Hkv, c.D}, rng, dt).set_requires_grad(true);
  Tensor up = Tensor::randn({T, c.Hq, c.D}, rng, dt);
  Tensor gq = q.to(kGpu).detach().set_requires_grad(true);
  Tensor gk = k.to(kGpu).detach().set_requires_grad(true);
  Tensor gv = v.to(kGpu).detach().set_requires_grad(true);
  Tensor gup = up.to(kGpu);

  // The op: flash on CUDA vs the CPU kernel.
  Tensor want = attention(q, k, v, cu, c.causal, scale);
  Tensor got = attention(gq, gk, gv, cu, c.causal, scale);
  CHECK(got.device() == kGpu);
  CHECK(rel_err(got, want) <= tol_fwd);
  want.backward(up);
  got.backward(gup);
  CHECK(rel_err(gq.grad(), q.grad()) <= tol_bwd_op);
  CHECK(rel_err(gk.grad(), k.grad()) <= tol_bwd_op);
  CHECK(rel_err(gv.grad(), v.grad()) <= tol_bwd_op);

  // Kernel level: flash vs reference CUDA kernels vs the CPU kernel, lse included, and the
  // backward of all three on the same out and lse (the flash forward's).
  const kernels::AttentionShape s = shape_of(c, T, scale);
  Tensor qd = gq.detach(), kd = gk.detach(), vd = gv.detach(), upd = gup.detach();
  // The kernels read the tile lists and offsets a layout keeps on the device.
  const VarlenLayout varlen = VarlenLayout::of(cu, T);
  const kernels::FlashTileSpecs specs = kernels::flash_tile_specs(s, dt);
  const kernels::TileList query_tiles = varlen.attention_tiles(kGpu, specs.queries),
                          key_tiles = varlen.attention_tiles(kGpu, specs.keys);
  const int32_t* cu_dev = varlen.device_offsets(kGpu).cu_seqlens;
  const int32_t* cu_host = cu.data<int32_t>();
  auto empty_like = [](const Tensor& t, DType d) { return testing::poisoned(t.shape(), d); };
  Tensor out_f = empty_like(qd, dt), lse_f = testing::poisoned({T, c.Hq}, DType::f32);
  Tensor out_r = empty_like(qd, dt), lse_r = testing::poisoned({T, c.Hq}, DType::f32);
  kc::attention_fwd<E>(out_f.data<E>(), lse_f.data<float>(), qd.data<E>(), kd.data<E>(),
                       vd.data<E>(), query_tiles, s, nullptr);
  kc::attention_ref_fwd<E>(out_r.data<E>(), lse_r.data<float>(), qd.data<E>(), kd.data<E>(),
                           vd.data<E>(), cu_dev, s, nullptr);
  Tensor out_c = Tensor::empty(qd.shape(), dt), lse_c = Tensor::empty({T, c.Hq});
  Tensor hq = q.detach(), hk = k.detach(), hv = v.detach();
  kernels::cpu::attention_fwd<E>(out_c.data<E>(), lse_c.data<float>(), hq.data<E>(), hk.data<E>(),
                                 hv.data<E>(), cu_host, s);
  CHECK(rel_err(out_f, out_r) <= tol_fwd);
  CHECK(rel_err(out_r, out_c) <= tol_fwd);
  CHECK(rel_err(lse_f, lse_c) <= 1e-5); // fp32 in both dtypes
  CHECK(rel_err(lse_r, lse_c) <= 1e-5);
  if constexpr (std::is_same_v<E, bf16>) { // the bf16 forward without tensor cores as well
    ::setenv("VLM_ATTENTION_SIMT", "1", 1);
    Tensor out_s = empty_like(qd, dt), lse_s = testing::poisoned({T, c.Hq}, DType::f32);
    kc::attention_fwd<E>(out_s.data<E>(), lse_s.data<float>(), qd.data<E>(), kd.data<E>(),
                         vd.data<E>(), query_tiles, s, nullptr);
    ::unsetenv("VLM_ATTENTION_SIMT");
    CHECK(rel_err(out_s, out_c) <= tol_fwd);
    CHECK(rel_err(lse_s, lse_c) <= 1e-5);
  }

  Tensor dq_f = empty_like(qd, dt), dk_f = empty_like(kd, dt), dv_f = empty_like(vd, dt);
  Tensor dq_r = empty_like(qd, dt), dk_r = empty_like(kd, dt), dv_r = empty_like(vd, dt);
  kc::attention_bwd<E>(dq_f.data<E>(), dk_f.data<E>(), dv_f.data<E>(), upd.data<E>(), qd.data<E>(),
                       kd.data<E>(), vd.data<E>(), out_f.data<E>(), lse_f.data<float>(), key_tiles,
                       query_tiles, s, nullptr);
  kc::attention_ref_bwd<E>(dq_r.data<E>(), dk_r.data<E>(), dv_r.data<E>(), upd.data<E>(),
                           qd.data<E>(), kd.data<E>(), vd.data<E>(), out_f.data<E>(),
                           lse_f.data<float>(), cu_dev, s, nullptr);
  CHECK(rel_err(dq_f, dq_r) <= tol_bwd_kernel);
  CHECK(rel_err(dk_f, dk_r) <= tol_bwd_kernel);
  CHECK(rel_err(dv_f, dv_r) <= tol_bwd_kernel);

  // Deterministic: a second backward gives the same bits.
  Tensor dq_2 = empty_like(qd, dt), dk_2 = empty_like(kd, dt), dv_2 = empty_like(vd, dt);
  kc::attention_bwd<E>(dq_2.data<E>(), dk_2.data<E>(), dv_2.data<E>(), upd.data<E>(), qd.data<E>(),
                       kd.data<E>(), vd.data<E>(), out_f.data<E>(), lse_f.data<float>(), key_tiles,
                       query_tiles, s, nullptr);
  CHECK(bit_equal(dq_2, dq_f));
  CHECK(bit_equal(dk_2, dk_f));
  CHECK(bit_equal(dv_2, dv_f));
  kc::device_synchronize();
}

const std::vector<int32_t> kLengths = {1, 63, 0, 64, 65, 300};

void run_head_dim(int64_t D) {
  uint64_t seed = uint64_t(D) * 100;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool causal : {true, false})
      for (int64_t ratio : {1, 2, 4}) {
        const Case c{4, 4 / ratio, D, causal, dt, kLengths};
        if (dt == DType::f32)
          check_case<float>(c, ++seed);
        else
          check_case<bf16>(c, ++seed);
      }
}

} // namespace

TEST_CASE("gpu attention: head dim 64 matches the CPU op and the reference kernels", "[gpu]") {
  require_device();
  run_head_dim(64);
}

TEST_CASE("gpu attention: head dim 72 matches the CPU op and the reference kernels", "[gpu]") {
  require_device();
  run_head_dim(72);
}

TEST_CASE("gpu attention: head dim 80 matches the CPU op and the reference kernels", "[gpu]") {
  require_device();
  run_head_dim(80);
}

TEST_CASE("gpu attention: head dim 128 matches the CPU op and the reference kernels", "[gpu]") {
  require_device();
  run_head_dim(128);
}

TEST_CASE("gpu attention: head dim 256 matches the CPU op and the reference kernels", "[gpu]") {
  require_device();
  run_head_dim(256);
}

TEST_CASE("gpu attention: odd head dims and a single long document", "[gpu]") {
  require_device();
  check_case<float>({6, 2, 40, true, DType::f32, {129}}, 1);
  check_case<float>({3, 1, 200, false, DType::f32, {97, 33}}, 2);
  check_case<bf16>({2, 2, 1, true, DType::bf16, {5, 1, 70}}, 3);
}

TEST_CASE("gpu attention: bf16 documents of 2048 and more tokens, causal and bidirectional",
          "[gpu]") {
  require_device();
  // 2048 (a whole number of tiles), 2085 (a ragged last tile) and a short one after them, GQA 2,
  // head dims 128 and 64 (the CPU reference in bf16 bounds the sizes: seconds on 4 cores).
  check_case<bf16>({4, 2, 128, true, DType::bf16, {2048, 2085, 100}}, 6);
  check_case<bf16>({2, 1, 64, false, DType::bf16, {2085}}, 7);
}

TEST_CASE("gpu attention: more than 65535 (token, head) rows over many documents", "[gpu]") {
  require_device();
  std::vector<int32_t> lengths;
  int32_t total = 0;
  for (int32_t i = 0; total < 70000; i++) {
    lengths.push_back(1 + (i * 7) % 40);
    total += lengths.back();
  }
  check_case<float>({2, 1, 64, true, DType::f32, lengths}, 4);
  check_case<bf16>({2, 2, 64, false, DType::bf16, lengths}, 5);
}

TEST_CASE("gpu attention: unsupported dtypes and head dims are rejected clearly", "[gpu]") {
  require_device();
  Rng rng(9);
  Tensor cu = offsets({5});
  Tensor q64 = Tensor::randn({5, 2, 8}, rng, DType::f64).to(kGpu);
  CHECK(testing::error_of([&] { attention(q64, q64, q64, cu, true, 1.0); }).find("f64") !=
        std::string::npos);
  Tensor big = Tensor::randn({5, 1, 320}, rng).to(kGpu);
  CHECK(testing::error_of([&] { attention(big, big, big, cu, true, 1.0); }).find("head_dim") !=
        std::string::npos);
  // cu_seqlens on the device works too (copied back to the host).
  Tensor x = Tensor::randn({5, 2, 8}, rng);
  Tensor want = attention(x, x, x, cu, true, 0.3);
  Tensor got = attention(x.to(kGpu), x.to(kGpu), x.to(kGpu), cu.to(kGpu), true, 0.3);
  CHECK(rel_err(got, want) <= 1e-5);
}

#else

TEST_CASE("gpu attention: skipped") { VLM_SKIP("built without CUDA"); }

#endif
