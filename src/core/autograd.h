// Reverse-mode autograd over a tape of named backward nodes.
//
// Every op that records history creates one Node subclass (e.g. RmsNormBackward) whose saved
// tensors are explicit members. The engine sorts the graph iteratively (dependency counts, no
// recursion), materializes zeros for outputs that got no gradient, runs each node once with grad
// mode off, sums gradients arriving at the same input, accumulates into leaf .grad and runs the
// leaf's post-accumulate hooks, and frees each node's saved state after use.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/core/tensor.h"

namespace vlm {

struct Edge {
  std::shared_ptr<Node> fn; // null when that input needs no gradient
  int input_nr = 0;         // which output of fn this edge feeds
};

struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

// Writes a weight gradient into `grad` in grad's dtype: beta = 1 adds it to grad's contents,
// beta = 0 overwrites them (see accumulate_weight_grad).
using GradWriter = std::function<void(Tensor& grad, float beta)>;

class Node {
public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // Gradients w.r.t. this node's outputs -> gradients w.r.t. its inputs, one per next_edges entry
  // (an undefined tensor where an input needs no gradient). Every gradient is defined, except for
  // an output that took a direct write (took_direct_grad) and got nothing through the graph.
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grad_outputs) = 0;
  // Frees saved tensors once the node has run (unless the graph is retained).
  virtual void release() {}
  // accumulate_weight_grad's part: a node that keeps the gradient of its output `output_nr` in
  // f32 storage of its own may let the op write it there, calling write(storage, beta) and
  // returning true (the op then returns no gradient for that input). Default: false, nothing
  // written. Overridden by AccumulateGrad and FSDP's gather node.
  virtual bool accept_direct_grad(int /*output_nr*/, const GradWriter& /*write*/) { return false; }
  // Whether output k took a direct write in the current pass (the engine then passes apply() an
  // undefined gradient for k where nothing arrived through the graph, instead of zeros).
  virtual bool took_direct_grad(size_t /*output_nr*/) const { return false; }
  // Whether input k leads anywhere that wants a gradient (skip computing it otherwise).
  bool needs_input_grad(size_t k) const { return k < next_edges.size() && next_edges[k].fn; }

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr = 0;
};

// Accumulates incoming gradient into a leaf's .grad (in its grad_dtype) and runs its
// post-accumulate hooks.
class AccumulateGrad final : public Node {
public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  const char* name() const override { return "AccumulateGrad"; }
  // Runs once per backward pass, after every gradient of the pass reached the leaf: adds the
  // incoming gradient (undefined when all of it was written directly) and runs the hooks.
  std::vector<Tensor> apply(std::vector<Tensor>& grad_outputs) override;
  // Writes into .grad directly when the leaf is bf16 with an f32 grad_dtype (false: nothing
  // written).
  bool accept_direct_grad(int output_nr, const GradWriter& write) override;
  bool took_direct_grad(size_t) const override { return accumulated_directly_; }

private:
  std::shared_ptr<TensorImpl> leaf_;
  bool accumulated_directly_ = false;
};

// Weight gradients of bf16 parameters in fp32 straight from the GEMM (issue 34). A bf16
// parameter whose gradient accumulates in f32 (set_grad_dtype(f32), as the trainer sets it,
// AMP's rule; FSDP's f32 gradient buffers) would otherwise get each pass's gradient rounded to
// bf16 by the backward GEMM before it is widened and added. This asks the node that `edge` (an
// op's input edge) leads to (Node::accept_direct_grad) to take the gradient as a write into its
// f32 storage; on true the op returns an undefined gradient for that input. Two nodes accept:
//   * a bf16 leaf's AccumulateGrad with an f32 grad_dtype: write(grad, beta) gets the leaf's f32
//     .grad and beta = 1, or, when .grad is undefined, a fresh f32 tensor of the leaf's shape and
//     beta = 0 (it becomes .grad). The leaf's post-accumulate hooks still run once per pass, when
//     its AccumulateGrad node runs (after every gradient of the pass reached the leaf, written
//     directly or not);
//   * FSDP's gather node of a bf16 unit (parallel/fsdp/fsdp.cpp): the parameter's slot in the
//   unit's
//     f32 gradient buffer, beta = 0 when the slot holds nothing yet; the reduction still runs
//     once, when the gather node runs after every gradient of the unit arrived.
// Returns false, writing nothing, for any other edge: another leaf dtype or grad_dtype, a .grad
// that is not a contiguous f32 tensor on the leaf's device, or any other node between the op
// and the leaf; the op returns its gradient as usual then.
bool accumulate_weight_grad(const Edge& edge, const GradWriter& write);

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  int output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;
  std::vector<GradHook> post_accumulate_hooks;
  std::string name;
  std::optional<DType> grad_dtype; // unset: the leaf's dtype
};

// --- grad mode -------------------------------------------------------------------------------
class GradMode {
public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class NoGradGuard {
public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
  bool prev_;
};

class EnableGradGuard {
public:
  EnableGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

private:
  bool prev_;
};

// --- recording history (used by ops) -----------------------------------------------------------
// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);
// Wires node->next_edges to the inputs and makes node the grad_fn of the outputs.
void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs);
template <typename NodeT>
void record(const std::shared_ptr<NodeT>& node, std::initializer_list<const Tensor*> inputs,
            std::initializer_list<Tensor*> outputs) {
  record(std::static_pointer_cast<Node>(node), std::vector<const Tensor*>(inputs),
         std::vector<Tensor*>(outputs));
}

// --- running backward ----------------------------------------------------------------------------
// Backpropagates from `roots` with the given gradients (an empty gradient on a scalar root means
// 1). Gradients accumulate into the .grad of leaves that require grad.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph = false);

// --- activation checkpointing
// ---------------------------------------------------------------------- Runs fn(inputs) without
// recording its inner graph; in backward, re-runs fn with grad enabled and backpropagates through
// the recomputed graph (parameters used inside fn receive their gradients then). fn must be
// deterministic, and it is kept until backward: capture by value whatever it needs beyond its
// inputs (tensors are cheap handles).
using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

} // namespace vlm
