#include "src/core/ops/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/gated_delta.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"
#include "src/core/ops/self_check.h"
#include "src/core/varlen.h"

namespace vlm {

using namespace ops_detail;

namespace {

constexpr const char* kOp = "gated_delta_rule";

// The kernels run in f32 (f64 for f64 inputs); bf16 is widened to f32.
DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// A contiguous copy in the compute dtype without autograd history (what kernels read and the node
// saves).
Tensor widened(const Tensor& t) {
  NoGradGuard no_grad;
  return t.detach().to(compute_dtype(t.dtype())).contiguous();
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, double scale) {
  const std::pair<const char*, const Tensor*> all[] = {
      {"q", &q}, {"k", &k}, {"v", &v}, {"g", &g}, {"beta", &beta}};
  for (auto [name, t] : all) {
    check_float(kOp, name, *t);
    check_same_dtype(kOp, "q", q, name, *t);
    check_same_device(kOp, "q", q, name, *t);
  }
  check_dim(kOp, "q", q, 3);
  check_dim(kOp, "v", v, 3);
  check_dim(kOp, "g", g, 2);
  check_dim(kOp, "beta", beta, 2);
  VLM_CHECK(k.shape() == q.shape(), kOp, ": k must have q's shape [T, HK, dk], got ",
            describe("q", q), ", ", describe("k", k));
  VLM_CHECK(v.size(0) == q.size(0), kOp, ": v [T, HV, dv] must have q's token count, got ",
            describe("q", q), ", ", describe("v", v));
  VLM_CHECK(q.size(1) > 0 && v.size(1) % q.size(1) == 0 && q.size(2) > 0 && v.size(2) > 0, kOp,
            ": v's heads must be a multiple of q/k's (HV % HK == 0) and dk, dv > 0, got ",
            describe("q", q), ", ", describe("v", v));
  const Shape gate_shape{v.size(0), v.size(1)};
  VLM_CHECK(g.shape() == gate_shape && beta.shape() == gate_shape, kOp,
            ": g and beta must be [T, HV] for ", describe("v", v), ", got ", describe("g", g), ", ",
            describe("beta", beta));
  VLM_CHECK(std::isfinite(scale), kOp, ": scale must be finite, got ", scale);
}

// *state, when defined: [docs, HV, dk, dv] in the compute dtype, on q's device.
void check_state(const Tensor& state, const Tensor& q, const Tensor& v, int64_t docs) {
  const Shape want{docs, v.size(1), q.size(2), v.size(2)};
  VLM_CHECK(state.shape() == want && state.dtype() == compute_dtype(q.dtype()), kOp,
            ": the state must be [docs, HV, dk, dv] = (", docs, ", ", want[1], ", ", want[2], ", ",
            want[3], ") ", dtype_name(compute_dtype(q.dtype())), " for ", describe("q", q), ", ",
            describe("v", v), ", got ", describe("state", state));
  check_same_device(kOp, "q", q, "state", state);
}

struct Inputs {
  Tensor q, k, v, g, beta; // contiguous, compute dtype, no history
};
using Grads = Inputs; // dq, dk, dv, dg, dbeta

Inputs host_copy(const Inputs& in) {
  const Device cpu = Device::cpu();
  return {in.q.to(cpu), in.k.to(cpu), in.v.to(cpu), in.g.to(cpu), in.beta.to(cpu)};
}

// The CUDA kernels' first-use check (src/core/ops/self_check.h), per (dk, dv) and form (chunked
// or recurrent; the 70-token document crosses a chunk boundary): forward (with an
// initial and a final state) and backward (with d_initial_state) on HK = 2, HV = 4 over
// documents of 1, 70, 0 and 9 tokens, unit-norm q and k, g in [-1.5, -0.01], beta in (0, 1),
// against the CPU recurrence in double on the same (float) inputs. fp32 sums of dk or dv
// products over 80 steps of a contracting recurrence: the CPU float kernels measure ~5e-7
// against double (tests/kernels/test_gated_delta.cpp); tolerance 1e-4 (max-norm relative),
// while a wrong index or term is 1e-2 or more.
template <typename T>
double cuda_error(bool chunked, int64_t dk, int64_t dv, Device device, void* stream) {
  const std::vector<int32_t> offsets{0, 1, 71, 71, 80};
  kernels::GatedDeltaShape s;
  s.tokens = 80;
  s.k_heads = 2;
  s.v_heads = 4;
  s.k_dim = dk;
  s.v_dim = dv;
  s.docs = int64_t(offsets.size()) - 1;
  s.scale = 1.0 / std::sqrt(double(dk));
  Rng rng(20260602);
  std::vector<double> q(size_t(s.tokens * s.k_heads * dk)), k(q.size());
  for (std::vector<double>* x : {&q, &k})
    for (size_t r = 0; r < x->size(); r += size_t(dk)) { // unit rows, as after the L2 norm
      double* row = x->data() + r;
      double norm = 0;
      for (int64_t d = 0; d < dk; d++) {
        row[d] = rng.normal();
        norm += row[d] * row[d];
      }
      for (int64_t d = 0; d < dk; d++) row[d] /= std::sqrt(norm);
    }
  const Shape gate{s.tokens, s.v_heads}, state{s.docs, s.v_heads, dk, dv};
  // Every input rounded to float once, then widened: both sides see the same values.
  const Tensor qf = Tensor::from_doubles(q, {s.tokens, s.k_heads, dk}),
               kf = Tensor::from_doubles(k, {s.tokens, s.k_heads, dk}),
               vf = Tensor::randn({s.tokens, s.v_heads, dv}, rng),
               gf = Tensor::uniform(gate, rng, -1.5, -0.01),
               bf = Tensor::uniform(gate, rng, 0.0, 1.0),
               hf = Tensor::randn(state, rng, DType::f32, 0.5),
               of = Tensor::randn({s.tokens, s.v_heads, dv}, rng);
  auto wide = [](const Tensor& t) { return t.to(DType::f64); };
  const Tensor qd = wide(qf), kd = wide(kf), vd = wide(vf), gd = wide(gf), bd = wide(bf),
               hd = wide(hf), od = wide(of);
  // The reference.
  auto empty64 = [](const Tensor& like) { return Tensor::empty(like.shape(), DType::f64); };
  Tensor out = empty64(vd), fin = empty64(hd), dq = empty64(qd), dk_ = empty64(kd),
         dv_ = empty64(vd), dg = empty64(gd), db = empty64(bd), dh = empty64(hd);
  kernels::cpu::gated_delta_recurrent_fwd<double>(
      out.data<double>(), fin.data<double>(), qd.data<double>(), kd.data<double>(),
      vd.data<double>(), gd.data<double>(), bd.data<double>(), hd.data<double>(), offsets.data(),
      s);
  kernels::cpu::gated_delta_recurrent_bwd<double>(
      dq.data<double>(), dk_.data<double>(), dv_.data<double>(), dg.data<double>(),
      db.data<double>(), dh.data<double>(), od.data<double>(), qd.data<double>(), kd.data<double>(),
      vd.data<double>(), gd.data<double>(), bd.data<double>(), hd.data<double>(), offsets.data(),
      s);
  // The kernels.
  auto on_dev = [&](const Tensor& t) { return t.to(device); };
  auto empty32 = [&](const Tensor& like) {
    return Tensor::empty(like.shape(), DType::f32, device);
  };
  Tensor Q = on_dev(qf), K = on_dev(kf), V = on_dev(vf), G = on_dev(gf), B = on_dev(bf),
         H = on_dev(hf), dO = on_dev(of);
  const VarlenLayout varlen =
      VarlenLayout::of(Tensor::from_vector(offsets, {s.docs + 1}), s.tokens);
  const kernels::VarlenOffsets docs = varlen.device_offsets(device);
  Tensor out_c = empty32(vf), fin_c = empty32(hf), dq_c = empty32(qf), dk_c = empty32(kf),
         dv_c = empty32(vf), dg_c = empty32(gf), db_c = empty32(bf), dh_c = empty32(hf);
  const auto fwd =
      chunked ? kernels::cuda::gated_delta_chunk_fwd : kernels::cuda::gated_delta_recurrent_fwd;
  const auto bwd =
      chunked ? kernels::cuda::gated_delta_chunk_bwd : kernels::cuda::gated_delta_recurrent_bwd;
  fwd(out_c.data<float>(), fin_c.data<float>(), Q.data<float>(), K.data<float>(), V.data<float>(),
      G.data<float>(), B.data<float>(), H.data<float>(), docs, s, stream);
  bwd(dq_c.data<float>(), dk_c.data<float>(), dv_c.data<float>(), dg_c.data<float>(),
      db_c.data<float>(), dh_c.data<float>(), dO.data<float>(), Q.data<float>(), K.data<float>(),
      V.data<float>(), G.data<float>(), B.data<float>(), H.data<float>(), docs, s, stream);
  double error = 0;
  const std::pair<Tensor, Tensor> pairs[] = {{out_c, out}, {fin_c, fin}, {dq_c, dq}, {dk_c, dk_},
                                             {dv_c, dv_},  {dg_c, dg},   {db_c, db}, {dh_c, dh}};
  for (const auto& [got, want] : pairs)
    error = std::max(error, max_rel_error(got.to(Device::cpu()).to_doubles(), want.to_doubles()));
  return error;
}

// Which CUDA kernels run for these head dims (each checked on first use): the chunked ones, else
// the recurrence, else none (the CPU kernels on host copies).
enum class CudaKernels { chunked, recurrent, none };

template <typename T>
CudaKernels cuda_kernels(const kernels::GatedDeltaShape& s, Device device, void* stream) {
  auto passes = [&](bool chunked) {
    const std::string key = detail::str_cat(kOp, chunked ? " chunked" : "", " f32 dk=", s.k_dim,
                                            " dv=", s.v_dim, " on ", device.str());
    return gpu_kernel_passes(
        key, 1e-4, [&] { return cuda_error<T>(chunked, s.k_dim, s.v_dim, device, stream); });
  };
  if (passes(true)) return CudaKernels::chunked;
  return passes(false) ? CudaKernels::recurrent : CudaKernels::none;
}

// Runs cpu(T{}) with T = float or double (the compute dtype) on the CPU, or cuda(float{}, stream)
// on a CUDA device (f64 there fails naming the op). Both bodies are generic: a CPU-only build
// never instantiates the CUDA one (src/core/dispatch.h).
template <typename Cpu, typename Cuda>
void run(const char* name, Device device, DType compute, Cpu&& cpu, Cuda&& cuda) {
  dispatch(
      name, device, compute,
      [&](auto t) {
        using T = decltype(t);
        if constexpr (std::is_same_v<T, bf16>)
          VLM_FAIL(name, ": the kernels run in f32 or f64, not bf16"); // widened before
        else
          cpu(t);
      },
      [&](auto t, void* stream) {
        using T = decltype(t);
        if constexpr (std::is_same_v<T, float>)
          cuda(t, stream);
        else
          VLM_FAIL(name, ": the kernels run in f32 or f64, not bf16"); // widened before
      });
}

struct Outputs {
  Tensor out, final_state;
};

// The forward on in's device (in: contiguous, compute dtype; initial: undefined or the state).
// CPU: the chunked kernel; CUDA: the chunked kernel, or the recurrence, or (both self-checks
// failed) the CPU kernel on host copies.
Outputs forward(const Inputs& in, const Tensor& initial, bool want_final,
                const VarlenLayout& varlen, const kernels::GatedDeltaShape& shape) {
  const Device device = in.q.device();
  const DType compute = in.q.dtype();
  Outputs r;
  r.out = Tensor::empty({shape.tokens, shape.v_heads, shape.v_dim}, compute, device);
  if (want_final)
    r.final_state =
        Tensor::empty({shape.docs, shape.v_heads, shape.k_dim, shape.v_dim}, compute, device);
  auto ptr = [](const Tensor& t, auto tag) {
    return t.defined() ? t.data<decltype(tag)>() : nullptr;
  };
  bool on_host = false;
  run(
      kOp, device, compute,
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::gated_delta_chunk_fwd<T>(r.out.data<T>(), ptr(r.final_state, t),
                                               in.q.data<T>(), in.k.data<T>(), in.v.data<T>(),
                                               in.g.data<T>(), in.beta.data<T>(), ptr(initial, t),
                                               varlen.cu_seqlens.data<int32_t>(), shape);
      },
      [&](auto t, void* stream) {
        const CudaKernels which = cuda_kernels<decltype(t)>(shape, device, stream);
        if (which == CudaKernels::none) {
          on_host = true;
          return;
        }
        const auto fwd = which == CudaKernels::chunked ? kernels::cuda::gated_delta_chunk_fwd
                                                       : kernels::cuda::gated_delta_recurrent_fwd;
        fwd(r.out.data<float>(), ptr(r.final_state, 0.f), in.q.data<float>(), in.k.data<float>(),
            in.v.data<float>(), in.g.data<float>(), in.beta.data<float>(), ptr(initial, 0.f),
            varlen.device_offsets(device), shape, stream);
      });
  if (!on_host) return r;
  const Tensor initial_host = initial.defined() ? initial.to(Device::cpu()) : Tensor();
  Outputs h = forward(host_copy(in), initial_host, want_final, varlen, shape);
  return {h.out.to(device), want_final ? h.final_state.to(device) : Tensor()};
}

// dq, dk, dv, dg, dbeta on in's device (as forward()).
Grads backward(const Tensor& dout, const Inputs& in, const VarlenLayout& varlen,
               const kernels::GatedDeltaShape& shape) {
  const Device device = in.q.device();
  const DType compute = in.q.dtype();
  auto like = [&](const Tensor& t) { return Tensor::empty(t.shape(), compute, device); };
  Grads d{like(in.q), like(in.k), like(in.v), like(in.g), like(in.beta)};
  bool on_host = false;
  run(
      kOp, device, compute,
      [&](auto t) {
        using T = decltype(t);
        kernels::cpu::gated_delta_chunk_bwd<T>(
            d.q.data<T>(), d.k.data<T>(), d.v.data<T>(), d.g.data<T>(), d.beta.data<T>(), nullptr,
            dout.data<T>(), in.q.data<T>(), in.k.data<T>(), in.v.data<T>(), in.g.data<T>(),
            in.beta.data<T>(), nullptr, varlen.cu_seqlens.data<int32_t>(), shape);
      },
      [&](auto t, void* stream) {
        const CudaKernels which = cuda_kernels<decltype(t)>(shape, device, stream);
        if (which == CudaKernels::none) {
          on_host = true;
          return;
        }
        const auto bwd = which == CudaKernels::chunked ? kernels::cuda::gated_delta_chunk_bwd
                                                       : kernels::cuda::gated_delta_recurrent_bwd;
        bwd(d.q.data<float>(), d.k.data<float>(), d.v.data<float>(), d.g.data<float>(),
            d.beta.data<float>(), nullptr, dout.data<float>(), in.q.data<float>(),
            in.k.data<float>(), in.v.data<float>(), in.g.data<float>(), in.beta.data<float>(),
            nullptr, varlen.device_offsets(device), shape, stream);
      });
  if (!on_host) return d;
  Grads h = backward(dout.to(Device::cpu()), host_copy(in), varlen, shape);
  return {h.q.to(device), h.k.to(device), h.v.to(device), h.g.to(device), h.beta.to(device)};
}

struct GatedDeltaBackward final : Node {
  Inputs in;
  VarlenLayout varlen; // the forward's (its device offsets are shared)
  kernels::GatedDeltaShape shape;
  DType dtype = DType::f32; // of the op's inputs and output
  const char* name() const override { return "GatedDeltaRuleBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Shape out_shape{shape.tokens, shape.v_heads, shape.v_dim};
    VLM_CHECK(grads[0].shape() == out_shape && grads[0].dtype() == dtype, name(), ": ",
              describe("grad", grads[0]), " does not match the output ", describe("v", in.v));
    Tensor dout = grads[0].to(in.q.dtype()).contiguous();
    Grads d = backward(dout, in, varlen, shape);
    auto result = [&](const Tensor& grad, size_t i) {
      return needs_input_grad(i) ? grad.to(dtype) : Tensor();
    };
    return {result(d.q, 0), result(d.k, 1), result(d.v, 2), result(d.g, 3), result(d.beta, 4)};
  }
  void release() override {
    in = Inputs();
    varlen = VarlenLayout();
  }
};

} // namespace

Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const VarlenLayout& varlen, double scale,
                        Tensor* state) {
  check_inputs(q, k, v, g, beta, scale);
  VLM_CHECK(varlen.cu_seqlens.defined() && varlen.tokens == q.size(0), kOp, ": the layout has ",
            varlen.tokens, " tokens but ", describe("q", q));
  const bool grad = needs_grad({&q, &k, &v, &g, &beta});
  VLM_CHECK(!state || !grad, kOp,
            ": a state (generation) takes no gradient; run under NoGradGuard or with inputs that "
            "do not require grad");
  kernels::GatedDeltaShape shape;
  shape.tokens = q.size(0);
  shape.k_heads = q.size(1);
  shape.v_heads = v.size(1);
  shape.k_dim = q.size(2);
  shape.v_dim = v.size(2);
  shape.docs = varlen.docs;
  shape.scale = scale;
  if (state && state->defined()) check_state(*state, q, v, shape.docs);

  if (q.device().is_cuda()) {
    VLM_CHECK(q.dtype() != DType::f64, kOp, ": CUDA runs f32 (bf16 widened to f32), got ",
              describe("q", q), " (f64 runs on CPU only)");
    VLM_CHECK(shape.k_dim <= kernels::cuda::kGatedDeltaMaxDim &&
                  shape.v_dim <= kernels::cuda::kGatedDeltaMaxDim,
              kOp, ": dk and dv <= ", kernels::cuda::kGatedDeltaMaxDim, " on CUDA, got ",
              describe("q", q), ", ", describe("v", v));
  }
  Inputs in{widened(q), widened(k), widened(v), widened(g), widened(beta)};
  const Tensor initial = state && state->defined() ? state->contiguous() : Tensor();
  auto [out, final_state] = forward(in, initial, state != nullptr, varlen, shape);
  if (out.dtype() != q.dtype()) {
    NoGradGuard no_grad;
    out = out.to(q.dtype());
  }
  if (state) *state = final_state;
  if (grad) {
    auto node = std::make_shared<GatedDeltaBackward>();
    node->in = in;
    node->varlen = varlen;
    node->shape = shape;
    node->dtype = q.dtype();
    record(node, {&q, &k, &v, &g, &beta}, {&out});
  }
  return out;
}

Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const Tensor& cu_seqlens, double scale, Tensor* state) {
  check_inputs(q, k, v, g, beta, scale);
  check_cu_seqlens(kOp, cu_seqlens, "q", q);
  return gated_delta_rule(q, k, v, g, beta, VarlenLayout::of(cu_seqlens, q.size(0)), scale, state);
}

} // namespace vlm
