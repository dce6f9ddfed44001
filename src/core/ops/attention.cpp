#include "src/core/ops/attention.h"

#include <cmath>

#include <optional>

#include "kernels/attention.h"
#include "src/core/autograd.h"
#include "src/core/ops/attention_cudnn.h"
#include "src/core/ops/common.h"
#include "src/core/varlen.h"

namespace vlm {

using namespace ops_detail;

namespace {

// The logsumexp is kept in the accumulation type: fp32, or f64 for f64 inputs.
DType lse_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

struct AttentionBackward final : Node {
  Tensor q, k, v, out, lse; // contiguous, detached
  VarlenLayout varlen;      // its device data (tile lists) shared with the forward
  kernels::AttentionShape shape;
  std::optional<CudnnAttentionSaved> cudnn; // set: the forward ran on cuDNN (q..lse view it)
  const char* name() const override { return "AttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0].contiguous();
    Tensor dq, dk, dv;
    if (cudnn && cudnn_attention_backward(*cudnn, g, dq, dk, dv))
      return {needs_input_grad(0) ? dq : Tensor(), needs_input_grad(1) ? dk : Tensor(),
              needs_input_grad(2) ? dv : Tensor()};
    // One kernel produces all three gradients; dq costs little next to dk/dv, so compute all.
    dq = Tensor::empty(q.shape(), q.dtype(), q.device());
    dk = Tensor::empty(k.shape(), k.dtype(), k.device());
    dv = Tensor::empty(v.shape(), v.dtype(), v.device());
    dispatch(
        "attention backward", q.device(), q.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::attention_bwd<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), g.data<T>(),
                                         q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                                         lse.data<acc_t<T>>(), varlen.cu_seqlens.data<int32_t>(),
                                         shape);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          const kernels::FlashTileSpecs specs = kernels::flash_tile_specs(shape, q.dtype());
          kernels::cuda::attention_bwd<T>(
              dq.data<T>(), dk.data<T>(), dv.data<T>(), g.data<T>(), q.data<T>(), k.data<T>(),
              v.data<T>(), out.data<T>(), lse.data<float>(),
              varlen.attention_tiles(q.device(), specs.keys),
              varlen.attention_tiles(q.device(), specs.queries), shape, stream);
        });
    return {needs_input_grad(0) ? dq : Tensor(), needs_input_grad(1) ? dk : Tensor(),
            needs_input_grad(2) ? dv : Tensor()};
  }
  void release() override {
    q = k = v = out = lse = Tensor();
    varlen = VarlenLayout();
    cudnn.reset();
  }
};

// q, k, v and scale as attention() takes them (the offsets are checked apart).
void check_operands(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  check_float("attention", "q", q);
  check_float("attention", "k", k);
  check_float("attention", "v", v);
  check_same_dtype("attention", "q", q, "k", k);
  check_same_dtype("attention", "q", q, "v", v);
  check_same_device("attention", "q", q, "k", k);
  check_same_device("attention", "q", q, "v", v);
  check_dim("attention", "q", q, 3);
  check_dim("attention", "k", k, 3);
  check_dim("attention", "v", v, 3);
  VLM_CHECK(k.shape() == v.shape(), "attention: k and v must have the same shape, got ",
            describe("k", k), ", ", describe("v", v));
  VLM_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2),
            "attention: q [T, Hq, D] and k [T, Hkv, D] must agree on T and D, got ",
            describe("q", q), ", ", describe("k", k));
  VLM_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0,
            "attention: query heads must be a multiple of kv heads, got ", describe("q", q), ", ",
            describe("k", k));
  VLM_CHECK(std::isfinite(scale), "attention: scale must be finite, got ", scale);
}

} // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const VarlenLayout& varlen,
                 bool causal, double scale) {
  check_operands(q, k, v, scale);
  VLM_CHECK(varlen.cu_seqlens.defined() && varlen.tokens == q.size(0), "attention: the layout has ",
            varlen.tokens, " tokens but ", describe("q", q));
  if (q.device().is_cuda()) {
    VLM_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              "attention: CUDA supports f32 and bf16, got ", describe("q", q),
              " (f64 runs on CPU)");
    VLM_CHECK(q.size(2) <= 256, "attention: head_dim <= 256 on CUDA, got ", describe("q", q));
  }

  kernels::AttentionShape shape;
  shape.tokens = q.size(0);
  shape.q_heads = q.size(1);
  shape.kv_heads = k.size(1);
  shape.head_dim = q.size(2);
  shape.docs = varlen.docs;
  shape.causal = causal;
  shape.scale = scale;

  Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  // CUDA bf16: cuDNN's fused attention where it runs this configuration
  // (kernels/attention_cudnn.h), else the own kernel below.
  std::optional<CudnnAttentionSaved> cudnn = cudnn_attention_forward(qc, kc, vc, varlen, shape);
  Tensor out, lse;
  if (cudnn) {
    out = first_rows(cudnn->out, shape.tokens);
    lse = first_rows(cudnn->lse, shape.tokens);
    qc = first_rows(cudnn->q, shape.tokens); // the backward keeps cuDNN's padded copies only
    kc = first_rows(cudnn->k, shape.tokens);
    vc = first_rows(cudnn->v, shape.tokens);
  } else {
    out = Tensor::empty(q.shape(), q.dtype(), q.device());
    lse = Tensor::empty({shape.tokens, shape.q_heads}, lse_dtype(q.dtype()), q.device());
  }
  if (!cudnn)
    dispatch(
        "attention", q.device(), q.dtype(),
        [&](auto t) {
          using T = decltype(t);
          kernels::cpu::attention_fwd<T>(out.data<T>(), lse.data<acc_t<T>>(), qc.data<T>(),
                                         kc.data<T>(), vc.data<T>(),
                                         varlen.cu_seqlens.data<int32_t>(), shape);
        },
        [&](auto t, void* stream) {
          using T = decltype(t);
          const kernels::TileSpec queries = kernels::flash_tile_specs(shape, q.dtype()).queries;
          kernels::cuda::attention_fwd<T>(
              out.data<T>(), lse.data<float>(), qc.data<T>(), kc.data<T>(), vc.data<T>(),
              varlen.attention_tiles(q.device(), queries), shape, stream);
        });
  if (needs_grad({&q, &k, &v})) {
    auto node = std::make_shared<AttentionBackward>();
    node->q = qc.detach();
    node->k = kc.detach();
    node->v = vc.detach();
    node->out = out.detach();
    node->lse = lse;
    node->varlen = varlen;
    node->shape = shape;
    node->cudnn = std::move(cudnn);
    record(node, {&q, &k, &v}, {&out});
  }
  return out;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                 bool causal, double scale) {
  check_operands(q, k, v, scale);
  check_defined("attention", "cu_seqlens", cu_seqlens);
  // The offsets are read on the host (a CUDA cu_seqlens is copied back, which synchronizes).
  const Tensor cu = cu_seqlens.device().is_cpu() ? cu_seqlens : cu_seqlens.to(Device::cpu());
  check_cu_seqlens("attention", cu, "q", q);
  return attention(q, k, v, VarlenLayout::of(cu, q.size(0)), causal, scale);
}

} // namespace vlm
