#include "model/selective_ac.h"

#include "kernels/gemm.h"
#include "src/base/dispatch.h"
#include "src/core/autograd.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

using kernels::cpu::GemmShape;

GemmShape mm(int64_t M, int64_t N, int64_t K, bool trans_a = false) {
  GemmShape s;
  s.M = M;
  s.N = N;
  s.K = K;
  s.trans_a = trans_a;
  return s;
}

void gemm(Tensor& c, const Tensor& a, const Tensor& b, const GemmShape& s) {
  VLM_CHECK(a.device().is_cpu(), "selective checkpointing: ", a.desc(), " is not on the CPU");
  VLM_DISPATCH_FLOAT(a.dtype(), "selective checkpointing", T, [&] {
    kernels::cpu::gemm<T>(c.data<T>(), a.data<T>(), b.data<T>(), s, 1.f, 0.f);
  });
}

// The backward of y = x w^T + b for a kept y: the same GEMMs, in the same layouts, as the
// backward of linear() (src/core/ops/matmul.cpp), so the gradients are bit-identical.
struct KeptLinearBackward final : Node {
  Tensor x2, w; // x as [rows, in], contiguous
  Shape x_shape;
  bool has_bias = false;
  const char* name() const override { return "KeptLinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    int64_t rows = x2.shape()[0], in = x2.shape()[1], out = w.shape()[0];
    Tensor g = reshape(grads[0].contiguous(), {rows, out});
    Tensor gx, gw, gbias;
    if (needs_input_grad(0)) {
      gx = Tensor::empty({rows, in}, x2.dtype(), x2.device());
      gemm(gx, g, w, mm(rows, in, out)); // g · w
      gx = reshape(gx, x_shape);
    }
    if (needs_input_grad(1)) {
      gw = Tensor::empty(w.shape(), w.dtype(), w.device());
      gemm(gw, g, x2, mm(out, in, rows, true)); // g^T · x
    }
    if (has_bias && needs_input_grad(2)) gbias = sum(g, {0});
    return {gx, gw, gbias};
  }
  void release() override { x2 = w = Tensor(); }
};

} // namespace

Tensor MatmulStash::linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (!GradMode::is_enabled()) { // the checkpoint's first run: compute and keep
    Tensor y = vlm::linear(x, w, bias);
    outputs_.push_back(y);
    return y;
  }
  // Recomputation: hand back the kept output.
  VLM_CHECK(next_ < outputs_.size(), "selective checkpointing: projection ", next_ + 1,
            " was not run in the first forward (", outputs_.size(),
            " kept); the block's forward must call its projections in the same order each time");
  Tensor kept = outputs_[next_++];
  Shape expected = x.shape();
  VLM_CHECK(!expected.empty() && w.dim() == 2, "selective checkpointing: linear of ", x.desc(),
            " and ", w.desc());
  expected.back() = w.size(0);
  VLM_CHECK(kept.shape() == expected && kept.dtype() == x.dtype(),
            "selective checkpointing: projection ", next_, " kept ", kept.desc(),
            " but the recomputation asks for ", shape_str(expected), " ", dtype_name(x.dtype()),
            "; the block's forward must be deterministic");
  Tensor y = kept.detach();
  if (needs_grad({&x, &w, &bias})) {
    const int64_t in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
    Tensor x2 = x.contiguous();
    auto node = std::make_shared<KeptLinearBackward>();
    node->x2 = x2.detach().as_strided({rows, in}, {in, 1}, x2.offset());
    node->w = w.contiguous().detach();
    node->x_shape = x.shape();
    node->has_bias = bias.defined();
    record(node, {&x, &w, &bias}, {&y});
  }
  return y;
}

size_t MatmulStash::nbytes() const {
  size_t n = 0;
  for (const auto& t : outputs_) n += t.nbytes();
  return n;
}

} // namespace vlm::model
