// The Gated DeltaNet kernels on CUDA against the CPU: the causal depthwise conv1d (f32 and bf16,
// SiLU on and off, kernel sizes 1, 3, 4, 8) and the gated delta rule, recurrent and chunked (f32:
// forward, final state, backward, d_initial_state; dk != dv, HV = HK and HV = 2·HK, dk = dv = 256
// whose recurrent backward keeps dS in global memory), over packed documents with empty, 1-token,
// 64/65-token and 200-token ones. The raw kernels are compared with the CPU kernels directly, so
// the ops' self-check fallback cannot hide a wrong kernel; the ops (autograd) run with
// VLM_GPU_SELF_CHECK=strict, and once with =fallback to cover the host path. Tolerances (max-norm
// relative error):
//  * conv1d f32 1e-5: the same fp32 sums in the same order (FMA contraction and expf differ,
//    ~1e-7); bf16 1e-2: an output may round to the neighbouring bf16 (2^-8 relative).
//  * delta rule f32 5e-5 against the recurrence in double on the same float inputs (the CPU float
//    kernels measure ~5e-7 there, host emulations of the recurrence and chunked CUDA kernels ~4e-7
//    and ~6e-7); through the ops (CPU and GPU: the chunked kernels) 1e-4 in f32, 2e-2 in bf16
//    (each side rounds its f32 result to bf16 once; gradients pass through bf16 casts).
// Skips (exit 77) with the device query text when there is no device.
#include <catch2/catch.hpp>

#include "tests/skip.h"

#if VLM_WITH_CUDA

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/conv1d.h"
#include "kernels/gated_delta.h"
#include "kernels/gpu_runtime.h"
#include "src/core/ops.h"
#include "src/core/varlen.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"

using namespace vlm;
namespace kc = vlm::kernels::cuda;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::leaf;
using vlm::testing::rel_err;
using vlm::testing::require_device;
using vlm::testing::same_bits;

namespace {

std::vector<int32_t> offsets_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

Tensor offsets(const std::vector<int32_t>& lengths) {
  const std::vector<int32_t> cu = offsets_of(lengths);
  return Tensor::from_vector(cu, {int64_t(cu.size())});
}

std::string lengths_str(const std::vector<int32_t>& lengths) {
  std::ostringstream os;
  for (int32_t len : lengths) os << ' ' << len;
  return os.str();
}

// An output buffer for a kernel: on the GPU poisoned with NaN (tests/gpu_testing.h), so an
// element the kernel does not write fails the comparison.
Tensor empty_on(const Tensor& like, Device device) {
  if (device.is_cuda()) return testing::poisoned_like(like, device);
  return Tensor::empty(like.shape(), like.dtype(), device);
}

// The offsets as the CUDA kernels read them: kept on the GPU by a layout (src/core/varlen.h), which
// the caller holds while the kernels run.
VarlenLayout layout_of(const std::vector<int32_t>& cu) {
  return VarlenLayout::of(Tensor::from_vector(cu, {int64_t(cu.size())}), cu.back());
}

// Sets VLM_GPU_SELF_CHECK for the rest of the process (each TEST_CASE is its own process).
void self_check_mode(const char* value) { setenv("VLM_GPU_SELF_CHECK", value, 1); }

const std::vector<int32_t> kLengths = {5, 1, 0, 70, 3, 200, 64, 65};

// --- conv1d ------------------------------------------------------------------------------------

template <typename E>
void check_conv_kernels(int64_t C, int64_t K, bool silu, const std::vector<int32_t>& lengths,
                        uint64_t seed) {
  const DType dt = std::is_same_v<E, float> ? DType::f32 : DType::bf16;
  const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int64_t T = cu.back(), docs = int64_t(lengths.size());
  INFO(dtype_name(dt) << " C=" << C << " K=" << K << " silu=" << silu << " lengths"
                      << lengths_str(lengths));
  Rng rng(seed);
  Tensor x = Tensor::randn({T, C}, rng, dt), w = Tensor::randn({C, K}, rng, dt, 0.5),
         dy = Tensor::randn({T, C}, rng, dt);
  Tensor y = empty_on(x, Device::cpu()), dx = empty_on(x, Device::cpu()),
         dw = empty_on(w, Device::cpu());
  kernels::cpu::causal_conv1d_fwd<E>(y.data<E>(), x.data<E>(), w.data<E>(), cu.data(), docs, T, C,
                                     K, silu);
  kernels::cpu::causal_conv1d_bwd<E>(dx.data<E>(), dw.data<E>(), dy.data<E>(), x.data<E>(),
                                     w.data<E>(), cu.data(), docs, T, C, K, silu);
  Tensor xd = gpu(x), wd = gpu(w), dyd = gpu(dy);
  Tensor yd = empty_on(x, kGpu), dxd = empty_on(x, kGpu), dwd = empty_on(w, kGpu);
  const VarlenLayout varlen = layout_of(cu);
  const kernels::VarlenOffsets dev = varlen.device_offsets(kGpu);
  kc::causal_conv1d_fwd<E>(yd.data<E>(), xd.data<E>(), wd.data<E>(), dev, T, C, K, silu, nullptr);
  kc::causal_conv1d_bwd<E>(dxd.data<E>(), dwd.data<E>(), dyd.data<E>(), xd.data<E>(), wd.data<E>(),
                           dev, T, C, K, silu, nullptr);
  CHECK(rel_err(yd, y) <= tol);
  CHECK(rel_err(dxd, dx) <= tol);
  CHECK(rel_err(dwd, dw) <= tol);
  // dw alone (dx null) and a second run: the same bits.
  Tensor dw2 = empty_on(w, kGpu);
  kc::causal_conv1d_bwd<E>(nullptr, dw2.data<E>(), dyd.data<E>(), xd.data<E>(), wd.data<E>(), dev,
                           T, C, K, silu, nullptr);
  CHECK(same_bits(dw2, dwd));
  kc::device_synchronize();
}

// The op with autograd on the GPU against the op on the CPU.
void check_conv_op(DType dt, bool silu, uint64_t seed) {
  const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
  INFO(dtype_name(dt) << " silu=" << silu);
  Rng rng(seed);
  Tensor cu = offsets(kLengths);
  const int64_t T = offsets_of(kLengths).back(), C = 48, K = 4;
  Tensor x = Tensor::randn({T, C}, rng, dt), w = Tensor::randn({C, K}, rng, dt, 0.5),
         up = Tensor::randn({T, C}, rng, dt);
  Tensor xc = leaf(x), wc = leaf(w), xg = leaf(gpu(x)), wg = leaf(gpu(w));
  Tensor yc = causal_conv1d(xc, wc, cu, silu), yg = causal_conv1d(xg, wg, cu, silu);
  REQUIRE(yg.device() == kGpu);
  run_backward({yc}, {up});
  run_backward({yg}, {gpu(up)});
  CHECK(rel_err(yg, yc) <= tol);
  CHECK(rel_err(xg.grad(), xc.grad()) <= tol);
  CHECK(rel_err(wg.grad(), wc.grad()) <= tol);
}

// --- the delta rule ------------------------------------------------------------------------------

struct DeltaCase {
  int64_t HK, HV, dk, dv;
  std::vector<int32_t> lengths;
};

struct DeltaInputs {
  Tensor q, k, v, g, beta, h0, dout; // f32 on the CPU
};

// q, k unit rows (as after the L2 norm), g in [-2, -0.01], beta in (0, 1).
DeltaInputs make_inputs(const DeltaCase& c, int64_t T, uint64_t seed) {
  NoGradGuard no_grad;
  Rng rng(seed);
  const int64_t docs = int64_t(c.lengths.size());
  DeltaInputs in;
  in.q = l2_normalize(Tensor::randn({T, c.HK, c.dk}, rng, DType::f64), 1e-6).to(DType::f32);
  in.k = l2_normalize(Tensor::randn({T, c.HK, c.dk}, rng, DType::f64), 1e-6).to(DType::f32);
  in.v = Tensor::randn({T, c.HV, c.dv}, rng);
  in.g = Tensor::uniform({T, c.HV}, rng, -2, -0.01);
  in.beta = Tensor::uniform({T, c.HV}, rng, 0, 1);
  in.h0 = Tensor::randn({docs, c.HV, c.dk, c.dv}, rng, DType::f32, 0.5);
  in.dout = Tensor::randn({T, c.HV, c.dv}, rng);
  return in;
}

// The raw CUDA kernels of one form (chunked or the recurrence) against the CPU recurrence.
void check_delta_kernels(const DeltaCase& c, uint64_t seed, bool chunked = false) {
  const std::vector<int32_t> cu = offsets_of(c.lengths);
  const int64_t T = cu.back();
  const auto fwd = chunked ? kc::gated_delta_chunk_fwd : kc::gated_delta_recurrent_fwd;
  const auto bwd = chunked ? kc::gated_delta_chunk_bwd : kc::gated_delta_recurrent_bwd;
  INFO((chunked ? "chunked" : "recurrent")
       << " HK=" << c.HK << " HV=" << c.HV << " dk=" << c.dk << " dv=" << c.dv << " lengths"
       << lengths_str(c.lengths));
  kernels::GatedDeltaShape s;
  s.tokens = T;
  s.k_heads = c.HK;
  s.v_heads = c.HV;
  s.k_dim = c.dk;
  s.v_dim = c.dv;
  s.docs = int64_t(c.lengths.size());
  s.scale = 1.0 / std::sqrt(double(c.dk));
  const DeltaInputs in = make_inputs(c, T, seed);
  // The reference: the recurrence in double on the same values.
  auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
  Tensor q = f64(in.q), k = f64(in.k), v = f64(in.v), g = f64(in.g), b = f64(in.beta),
         h0 = f64(in.h0), dout = f64(in.dout);
  auto e64 = [](const Tensor& like) { return Tensor::empty(like.shape(), DType::f64); };
  Tensor out = e64(v), fin = e64(h0), dq = e64(q), dk = e64(k), dv = e64(v), dg = e64(g),
         db = e64(b), dh0 = e64(h0);
  for (bool with_h0 : {true, false}) {
    INFO("initial state " << with_h0);
    const double* h0p = with_h0 ? h0.data<double>() : nullptr;
    kernels::cpu::gated_delta_recurrent_fwd<double>(
        out.data<double>(), fin.data<double>(), q.data<double>(), k.data<double>(),
        v.data<double>(), g.data<double>(), b.data<double>(), h0p, cu.data(), s);
    kernels::cpu::gated_delta_recurrent_bwd<double>(
        dq.data<double>(), dk.data<double>(), dv.data<double>(), dg.data<double>(),
        db.data<double>(), dh0.data<double>(), dout.data<double>(), q.data<double>(),
        k.data<double>(), v.data<double>(), g.data<double>(), b.data<double>(), h0p, cu.data(), s);
    Tensor Q = gpu(in.q), K = gpu(in.k), V = gpu(in.v), G = gpu(in.g), B = gpu(in.beta),
           H0 = gpu(in.h0), dO = gpu(in.dout);
    const VarlenLayout varlen = layout_of(cu);
    const kernels::VarlenOffsets dev = varlen.device_offsets(kGpu);
    const float* H0p = with_h0 ? H0.data<float>() : nullptr;
    Tensor out_c = empty_on(V, kGpu), fin_c = empty_on(H0, kGpu), dq_c = empty_on(Q, kGpu),
           dk_c = empty_on(K, kGpu), dv_c = empty_on(V, kGpu), dg_c = empty_on(G, kGpu),
           db_c = empty_on(B, kGpu), dh0_c = empty_on(H0, kGpu);
    fwd(out_c.data<float>(), fin_c.data<float>(), Q.data<float>(), K.data<float>(), V.data<float>(),
        G.data<float>(), B.data<float>(), H0p, dev, s, nullptr);
    bwd(dq_c.data<float>(), dk_c.data<float>(), dv_c.data<float>(), dg_c.data<float>(),
        db_c.data<float>(), dh0_c.data<float>(), dO.data<float>(), Q.data<float>(), K.data<float>(),
        V.data<float>(), G.data<float>(), B.data<float>(), H0p, dev, s, nullptr);
    const double tol = 5e-5;
    if (T > 0) {
      CHECK(rel_err(out_c, out) <= tol);
      CHECK(rel_err(dq_c, dq) <= tol);
      CHECK(rel_err(dk_c, dk) <= tol);
      CHECK(rel_err(dv_c, dv) <= tol);
      CHECK(rel_err(dg_c, dg) <= tol);
      CHECK(rel_err(db_c, db) <= tol);
    }
    CHECK(rel_err(fin_c, fin) <= tol);
    CHECK(rel_err(dh0_c, dh0) <= tol);
    // Deterministic: a second backward (without d_initial_state) gives the same bits.
    Tensor dq_2 = empty_on(Q, kGpu), dk_2 = empty_on(K, kGpu), dg_2 = empty_on(G, kGpu);
    bwd(dq_2.data<float>(), dk_2.data<float>(), dv_c.data<float>(), dg_2.data<float>(),
        db_c.data<float>(), nullptr, dO.data<float>(), Q.data<float>(), K.data<float>(),
        V.data<float>(), G.data<float>(), B.data<float>(), H0p, dev, s, nullptr);
    CHECK(same_bits(dq_2, dq_c));
    CHECK(same_bits(dk_2, dk_c));
    CHECK(same_bits(dg_2, dg_c));
  }
  kc::device_synchronize();
}

// gated_delta_rule with autograd on the GPU against the op on the CPU, in dtype dt.
void check_delta_op(const DeltaCase& c, DType dt, uint64_t seed) {
  const double tol = dt == DType::f32 ? 1e-4 : 2e-2;
  Tensor cu = offsets(c.lengths);
  const int64_t T = offsets_of(c.lengths).back();
  INFO(dtype_name(dt) << " HK=" << c.HK << " HV=" << c.HV << " dk=" << c.dk << " dv=" << c.dv);
  const DeltaInputs in = make_inputs(c, T, seed);
  const double scale = 1.0 / std::sqrt(double(c.dk));
  std::vector<Tensor> cpu_leaves, gpu_leaves;
  for (const Tensor& t : {in.q, in.k, in.v, in.g, in.beta}) {
    cpu_leaves.push_back(leaf(t.to(dt)));
    gpu_leaves.push_back(leaf(gpu(t.to(dt))));
  }
  auto op = [&](const std::vector<Tensor>& l) {
    return gated_delta_rule(l[0], l[1], l[2], l[3], l[4], cu, scale);
  };
  Tensor oc = op(cpu_leaves), og = op(gpu_leaves);
  REQUIRE(og.device() == kGpu);
  REQUIRE(og.dtype() == dt);
  run_backward({oc}, {in.dout.to(dt)});
  run_backward({og}, {gpu(in.dout.to(dt))});
  CHECK(rel_err(og, oc) <= tol);
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
  for (size_t i = 0; i < 5; i++) {
    INFO(names[i]);
    CHECK(rel_err(gpu_leaves[i].grad(), cpu_leaves[i].grad()) <= tol);
  }
  // Generation: initial and final states (no gradient).
  NoGradGuard no_grad;
  Tensor state_c = in.h0, state_g = gpu(in.h0);
  Tensor sc = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, cu, scale, &state_c);
  Tensor sg = gated_delta_rule(gpu(in.q), gpu(in.k), gpu(in.v), gpu(in.g), gpu(in.beta), cu, scale,
                               &state_g);
  CHECK(rel_err(sg, sc) <= 1e-4);
  CHECK(rel_err(state_g, state_c) <= 1e-4);
}

} // namespace

TEST_CASE("gpu gated delta: conv1d kernels match the CPU kernels", "[gpu]") {
  require_device();
  uint64_t seed = 1;
  for (int64_t K : {1, 3, 4, 8})
    for (bool silu : {false, true})
      for (int64_t C : {48, 37}) {
        check_conv_kernels<float>(C, K, silu, kLengths, ++seed);
        check_conv_kernels<bf16>(C, K, silu, kLengths, ++seed);
      }
  // One token; only empty documents (dw is zero); a long single document (many dw blocks).
  check_conv_kernels<float>(16, 4, true, {1}, ++seed);
  check_conv_kernels<float>(16, 4, true, {0, 0}, ++seed);
  check_conv_kernels<bf16>(40, 4, true, {0, 5000, 1}, ++seed);
}

TEST_CASE("gpu gated delta: causal_conv1d op (autograd) matches the CPU op", "[gpu]") {
  require_device();
  self_check_mode("strict");
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool silu : {false, true}) check_conv_op(dt, silu, ++seed);
  Rng rng(1);
  Tensor x = gpu(Tensor::randn({5, 3}, rng)), w = gpu(Tensor::randn({3, 9}, rng));
  CHECK_THAT(testing::error_of([&] { causal_conv1d(x, w, offsets({5}), true); }),
             Catch::Contains("kernel_size <= 8"));
}

TEST_CASE("gpu gated delta: delta rule kernels match the CPU recurrence", "[gpu]") {
  require_device();
  uint64_t seed = 200;
  check_delta_kernels({2, 4, 128, 128, kLengths}, ++seed); // Qwen3.5's dims, GVA
  check_delta_kernels({2, 2, 64, 32, {200, 1, 0, 9}}, ++seed);
  check_delta_kernels({1, 2, 32, 96, {1, 65, 64, 0}}, ++seed);
  check_delta_kernels({3, 6, 40, 24, {130}}, ++seed);      // dims not multiples of 32
  check_delta_kernels({1, 1, 256, 256, {1, 100}}, ++seed); // dS in global memory
  check_delta_kernels({1, 2, 16, 16, {0, 0}}, ++seed);     // no tokens: final = initial state
}

TEST_CASE("gpu gated delta: chunked delta rule kernels match the CPU recurrence", "[gpu]") {
  require_device();
  uint64_t seed = 250;
  const bool chunked = true;
  check_delta_kernels({2, 4, 128, 128, kLengths}, ++seed, chunked); // Qwen3.5's dims, GVA
  check_delta_kernels({2, 2, 64, 32, {200, 1, 0, 9}}, ++seed, chunked);
  check_delta_kernels({1, 2, 32, 96, {1, 65, 64, 0, 63}}, ++seed, chunked);
  check_delta_kernels({3, 6, 40, 24, {130}}, ++seed, chunked); // dims not multiples of 32
  check_delta_kernels({2, 4, 32, 48, {1, 63, 64, 0, 65, 200}}, ++seed, chunked); // groups 32 + 16
  check_delta_kernels({1, 2, 256, 64, {65, 2}}, ++seed, chunked); // dk = 256: groups of 8 columns
  check_delta_kernels({1, 1, 256, 256, {1, 100}}, ++seed, chunked);
  check_delta_kernels({1, 2, 16, 16, {0, 0}}, ++seed, chunked); // no tokens: final = initial state
}

TEST_CASE("gpu gated delta: gated_delta_rule op (autograd) matches the CPU op", "[gpu]") {
  require_device();
  self_check_mode("strict");
  uint64_t seed = 300;
  for (DType dt : {DType::f32, DType::bf16}) {
    check_delta_op({2, 4, 64, 48, kLengths}, dt, ++seed);
    check_delta_op({2, 2, 32, 32, {1, 200}}, dt, ++seed);
  }
  Rng rng(1);
  Tensor q = gpu(Tensor::randn({5, 1, 8}, rng, DType::f64)),
         v = gpu(Tensor::randn({5, 1, 8}, rng, DType::f64)),
         g = gpu(Tensor::zeros({5, 1}, DType::f64));
  CHECK_THAT(testing::error_of([&] { gated_delta_rule(q, q, v, g, g, offsets({5}), 1.0); }),
             Catch::Contains("f64"));
}

TEST_CASE("gpu gated delta: after a failed self-check the ops run the CPU kernels", "[gpu]") {
  require_device();
  self_check_mode("fallback");
  check_conv_op(DType::f32, true, 400);
  check_conv_op(DType::bf16, false, 401);
  check_delta_op({2, 4, 32, 16, kLengths}, DType::f32, 402);
  check_delta_op({1, 1, 16, 16, {3, 70}}, DType::bf16, 403);
}

#else

TEST_CASE("gpu gated delta: skipped") { VLM_SKIP("built without CUDA"); }

#endif
