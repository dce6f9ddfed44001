#include "src/core/ops/gated_delta.h"

#include <cmath>
#include <type_traits>

#include "kernels/gated_delta.h"
#include "src/core/autograd.h"
#include "src/core/ops/common.h"

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

// Runs cpu(T{}) with T = float or double (the compute dtype) on the CPU; there is no CUDA kernel.
template <typename Cpu> void run_cpu(const char* name, Device device, DType compute, Cpu&& cpu) {
  dispatch(
      name, device, compute,
      [&](auto t) {
        using T = decltype(t);
        if constexpr (std::is_same_v<T, bf16>)
          VLM_FAIL(name, ": the kernels run in f32 or f64, not bf16"); // widened before
        else
          cpu(t);
      },
      [&](auto, void*) { VLM_FAIL(name, ": no CUDA kernel yet (CPU only)"); });
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

struct GatedDeltaBackward final : Node {
  Inputs in;
  Tensor cu_seqlens; // a private CPU copy
  kernels::GatedDeltaShape shape;
  DType dtype = DType::f32; // of the op's inputs and output
  const char* name() const override { return "GatedDeltaRuleBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Shape out_shape{shape.tokens, shape.v_heads, shape.v_dim};
    VLM_CHECK(grads[0].shape() == out_shape && grads[0].dtype() == dtype, name(), ": ",
              describe("grad", grads[0]), " does not match the output ", describe("v", in.v));
    const DType compute = in.q.dtype();
    const Device device = in.q.device();
    Tensor dout = grads[0].to(compute).contiguous();
    auto like = [&](const Tensor& t) { return Tensor::empty(t.shape(), compute, device); };
    Tensor dq = like(in.q), dk = like(in.k), dv = like(in.v), dg = like(in.g),
           dbeta = like(in.beta);
    run_cpu(name(), device, compute, [&](auto t) {
      using T = decltype(t);
      kernels::cpu::gated_delta_chunk_bwd<T>(
          dq.data<T>(), dk.data<T>(), dv.data<T>(), dg.data<T>(), dbeta.data<T>(), nullptr,
          dout.data<T>(), in.q.data<T>(), in.k.data<T>(), in.v.data<T>(), in.g.data<T>(),
          in.beta.data<T>(), nullptr, cu_seqlens.data<int32_t>(), shape);
    });
    auto result = [&](const Tensor& d, size_t i) {
      return needs_input_grad(i) ? d.to(dtype) : Tensor();
    };
    return {result(dq, 0), result(dk, 1), result(dv, 2), result(dg, 3), result(dbeta, 4)};
  }
  void release() override {
    in = Inputs();
    cu_seqlens = Tensor();
  }
};

} // namespace

Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, const Tensor& cu_seqlens, double scale, Tensor* state) {
  check_inputs(q, k, v, g, beta, scale);
  // A private host copy: backward must see the validated offsets.
  Tensor cu = cu_seqlens.defined() && cu_seqlens.device().is_cpu() ? cu_seqlens.contiguous().clone()
                                                                   : cu_seqlens;
  check_cu_seqlens(kOp, cu, "q", q);
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
  shape.docs = cu.size(0) - 1;
  shape.scale = scale;
  if (state && state->defined()) check_state(*state, q, v, shape.docs);

  const DType compute = compute_dtype(q.dtype());
  Inputs in;
  Tensor out, final_state;
  run_cpu(kOp, q.device(), compute, [&](auto t) {
    using T = decltype(t);
    in = Inputs{widened(q), widened(k), widened(v), widened(g), widened(beta)};
    Tensor initial = state && state->defined() ? state->contiguous() : Tensor();
    if (state)
      final_state =
          Tensor::empty({shape.docs, shape.v_heads, shape.k_dim, shape.v_dim}, compute, q.device());
    out = Tensor::empty({shape.tokens, shape.v_heads, shape.v_dim}, compute, q.device());
    kernels::cpu::gated_delta_chunk_fwd<T>(
        out.data<T>(), state ? final_state.data<T>() : nullptr, in.q.data<T>(), in.k.data<T>(),
        in.v.data<T>(), in.g.data<T>(), in.beta.data<T>(),
        initial.defined() ? initial.data<T>() : nullptr, cu.data<int32_t>(), shape);
  });
  if (out.dtype() != q.dtype()) {
    NoGradGuard no_grad;
    out = out.to(q.dtype());
  }
  if (state) *state = final_state;
  if (grad) {
    auto node = std::make_shared<GatedDeltaBackward>();
    node->in = in;
    node->cu_seqlens = cu;
    node->shape = shape;
    node->dtype = q.dtype();
    record(node, {&q, &k, &v, &g, &beta}, {&out});
  }
  return out;
}

} // namespace vlm
