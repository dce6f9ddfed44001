#include "parallel/tensor_parallel_ops.h"

#include "src/core/autograd.h"

namespace vlm::parallel {

namespace {

struct CopyToTpBackward final : Node {
  ProcessGroup* tp = nullptr;
  const char* name() const override { return "CopyToTpBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override {
    Tensor sum = g[0].clone(); // the incoming gradient may be shared: reduce a copy
    tp->all_reduce(sum);
    return {sum};
  }
};

struct ReduceFromTpBackward final : Node {
  const char* name() const override { return "ReduceFromTpBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {g[0]}; }
};

} // namespace

Tensor copy_to_tp(const Tensor& x, ProcessGroup& tp) {
  Tensor out = x.detach(); // the same storage; the new handle carries the backward's collective
  if (needs_grad({&x})) {
    auto node = std::make_shared<CopyToTpBackward>();
    node->tp = &tp;
    record(node, {&x}, {&out});
  }
  return out;
}

Tensor reduce_from_tp(const Tensor& x, ProcessGroup& tp) {
  Tensor out = x.detach().clone();
  tp.all_reduce(out);
  if (needs_grad({&x})) record(std::make_shared<ReduceFromTpBackward>(), {&x}, {&out});
  return out;
}

} // namespace vlm::parallel
