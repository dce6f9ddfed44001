#include "src/core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>

#include "src/core/ops/elementwise.h"

namespace vlm {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_sequence_nr{0};

// The edge through which gradient reaches t: its grad_fn, or the leaf's grad accumulator.
Edge gradient_edge(const Tensor& t) {
  auto& meta = t.autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  auto acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}
} // namespace

bool GradMode::is_enabled() { return g_grad_enabled; }
void GradMode::set_enabled(bool enabled) { g_grad_enabled = enabled; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (auto* t : inputs)
    if (t && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (auto& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs) {
  node->sequence_nr = g_sequence_nr++;
  node->next_edges.clear();
  for (auto* in : inputs) {
    if (in && in->requires_grad())
      node->next_edges.push_back(gradient_edge(*in));
    else
      node->next_edges.push_back(Edge{});
  }
  node->outputs.clear();
  for (size_t i = 0; i < outputs.size(); i++) {
    Tensor& out = *outputs[i];
    auto& meta = out.autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = int(i);
    node->outputs.push_back({out.shape(), out.dtype(), out.device()});
  }
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  Tensor t(leaf_);
  outputs.push_back({t.shape(), t.dtype(), t.device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>& grads) {
  Tensor leaf(leaf_);
  Tensor& g = grads[0];
  auto& meta = leaf.autograd_meta();
  if (g.defined()) {
    VLM_CHECK(g.shape() == leaf.shape(), "gradient ", g.desc(), " for leaf ", leaf.name(), " ",
              leaf.desc(), " has the wrong shape");
    if (!meta.grad.defined()) {
      // Own a private copy: the incoming tensor may also be another tensor's gradient (a cast
      // makes one already).
      const DType dtype = leaf.grad_dtype();
      meta.grad = g.dtype() == dtype ? g.clone() : g.to(dtype);
    } else {
      add_(meta.grad, g.to(meta.grad.dtype()));
    }
  } else {
    VLM_CHECK(accumulated_directly_, "AccumulateGrad: no gradient for leaf ", leaf.name(), " ",
              leaf.desc());
  }
  accumulated_directly_ = false;
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf);
  return {};
}

bool AccumulateGrad::accept_direct_grad(int, const GradWriter& write) {
  Tensor leaf(leaf_);
  if (leaf.dtype() != DType::bf16 || leaf.grad_dtype() != DType::f32) return false;
  auto& meta = leaf.autograd_meta();
  if (meta.grad.defined()) {
    const Tensor& g = meta.grad;
    if (g.dtype() != DType::f32 || !g.is_contiguous() || g.device() != leaf.device()) return false;
    write(meta.grad, 1.f);
  } else {
    Tensor fresh = Tensor::empty(leaf.shape(), DType::f32, leaf.device());
    write(fresh, 0.f);
    meta.grad = fresh;
  }
  accumulated_directly_ = true;
  return true;
}

bool accumulate_weight_grad(const Edge& edge, const GradWriter& write) {
  return edge.fn && edge.fn->accept_direct_grad(edge.input_nr, write);
}

namespace {

using NodePtr = std::shared_ptr<Node>;

// The gradients that the nodes of one backward pass have received so far, one slot per output.
class GradBuffers {
public:
  // Adds g into fn's output slot: the first gradient is kept as it is, later ones are summed.
  void deposit(const NodePtr& fn, int slot, const Tensor& g) {
    auto& buf = grads_[fn.get()];
    if (buf.size() < fn->outputs.size()) buf.resize(fn->outputs.size());
    if (!buf[slot].defined())
      buf[slot] = g;
    else
      buf[slot] = add(buf[slot], g);
  }

  // The node's gradients, taken out of the buffers (it runs once); an output that no gradient
  // reached gets zeros, so apply() sees one defined gradient per output — except an output whose
  // gradient was written straight into the node's storage (took_direct_grad), which gets none.
  std::vector<Tensor> take(const Node& node) {
    auto it = grads_.find(&node);
    std::vector<Tensor> gin = it != grads_.end() ? std::move(it->second) : std::vector<Tensor>{};
    if (it != grads_.end()) grads_.erase(it);
    gin.resize(std::max<size_t>(node.outputs.size(), gin.size()));
    for (size_t k = 0; k < node.outputs.size(); k++)
      if (!gin[k].defined() && !node.took_direct_grad(k)) {
        auto& m = node.outputs[k];
        gin[k] = Tensor::zeros(m.shape, m.dtype, m.device);
      }
    return gin;
  }

private:
  std::unordered_map<const Node*, std::vector<Tensor>> grads_;
};

// Checks the roots and their gradients (implicit only for a scalar root: 1), deposits each at
// the node that receives it and returns those nodes, in root order.
std::vector<NodePtr> seed_roots(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                GradBuffers& buffers) {
  std::vector<NodePtr> root_nodes;
  for (size_t i = 0; i < roots.size(); i++) {
    const Tensor& r = roots[i];
    VLM_CHECK(r.requires_grad(), "backward: root ", i, " (", r.desc(),
              ") does not require grad and has no grad_fn");
    Tensor g = grads[i];
    if (!g.defined()) {
      VLM_CHECK(r.numel() == 1, "backward: gradient can be implicit only for a scalar root, got ",
                r.desc());
      g = Tensor::ones(r.shape(), r.dtype(), r.device());
    }
    VLM_CHECK(g.shape() == r.shape(), "backward: gradient ", g.desc(), " does not match root ",
              r.desc());
    Edge e = gradient_edge(r);
    buffers.deposit(e.fn, e.input_nr, g);
    root_nodes.push_back(e.fn);
  }
  return root_nodes;
}

// Dependency counts: how many edges point at each node among those reachable from the roots (a
// node runs once every node that feeds it a gradient has run).
std::unordered_map<Node*, int> count_dependencies(const std::vector<NodePtr>& root_nodes) {
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& n : root_nodes)
    if (!seen[n.get()]) {
      seen[n.get()] = true;
      stack.push_back(n.get());
    }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next_edges) {
      if (!e.fn) continue;
      deps[e.fn.get()]++;
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
      }
    }
  }
  return deps;
}

// Ready nodes run latest-created first, which frees activations in reverse forward order.
struct CreatedEarlier {
  bool operator()(const NodePtr& a, const NodePtr& b) const {
    return a->sequence_nr < b->sequence_nr;
  }
};
using ReadyQueue = std::priority_queue<NodePtr, std::vector<NodePtr>, CreatedEarlier>;

// The root nodes that wait for no other node, each queued once.
ReadyQueue ready_roots(const std::vector<NodePtr>& root_nodes,
                       std::unordered_map<Node*, int>& deps) {
  ReadyQueue ready;
  std::unordered_map<Node*, bool> queued;
  for (auto& n : root_nodes)
    if (deps[n.get()] == 0 && !queued[n.get()]) {
      queued[n.get()] = true;
      ready.push(n);
    }
  return ready;
}

// Passes the gradients that `node` computed for its inputs (gout; empty: none) along its edges,
// checking each against the shape the next node expects, and queues every next node whose last
// dependency this was.
void propagate(const Node& node, const std::vector<Tensor>& gout, GradBuffers& buffers,
               std::unordered_map<Node*, int>& deps, ReadyQueue& ready) {
  VLM_CHECK(gout.empty() || gout.size() == node.next_edges.size(), node.name(), " returned ",
            gout.size(), " gradients for ", node.next_edges.size(), " inputs");
  for (size_t k = 0; k < node.next_edges.size(); k++) {
    const Edge& e = node.next_edges[k];
    if (!e.fn) continue;
    if (k < gout.size() && gout[k].defined()) {
      const Shape& expected = e.fn->outputs[e.input_nr].shape;
      VLM_CHECK(gout[k].shape() == expected, node.name(), ": gradient for input ", k, " is ",
                gout[k].desc(), " but the input has shape ", shape_str(expected));
      buffers.deposit(e.fn, e.input_nr, gout[k]);
    }
    if (--deps[e.fn.get()] == 0) ready.push(e.fn);
  }
}

} // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph) {
  VLM_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(),
            " gradients");
  NoGradGuard no_grad; // backward formulas are not themselves recorded

  GradBuffers buffers;
  const std::vector<NodePtr> root_nodes = seed_roots(roots, grads, buffers);
  std::unordered_map<Node*, int> deps = count_dependencies(root_nodes);
  ReadyQueue ready = ready_roots(root_nodes, deps);
  while (!ready.empty()) {
    NodePtr node = ready.top();
    ready.pop();
    std::vector<Tensor> gin = buffers.take(*node);
    std::vector<Tensor> gout = node->apply(gin);
    if (!retain_graph) node->release(); // frees what the node saved for backward
    gin.clear();
    propagate(*node, gout, buffers, deps, ready);
  }
}

// --- checkpoint ---------------------------------------------------------------------------------

namespace {

class CheckpointBackward final : public Node {
public:
  CheckpointBackward(CheckpointFn fn, std::vector<Tensor> inputs)
      : fn_(std::move(fn)), inputs_(std::move(inputs)) {}
  const char* name() const override { return "CheckpointBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>& grad_outputs) override {
    std::vector<Tensor> leaves;
    for (auto& in : inputs_) {
      Tensor leaf = in.detach();
      if (in.requires_grad()) leaf.set_requires_grad(true);
      leaves.push_back(leaf);
    }
    std::vector<Tensor> outs;
    {
      EnableGradGuard grad_on;
      outs = fn_(leaves);
    }
    VLM_CHECK(outs.size() == grad_outputs.size(), "checkpoint: recomputation returned ",
              outs.size(), " outputs, the first run ", grad_outputs.size());
    std::vector<Tensor> roots, grads;
    for (size_t i = 0; i < outs.size(); i++) {
      if (!outs[i].requires_grad()) continue;
      roots.push_back(outs[i]);
      grads.push_back(grad_outputs[i]);
    }
    if (!roots.empty()) run_backward(roots, grads);
    std::vector<Tensor> result;
    for (auto& l : leaves) result.push_back(l.requires_grad() ? l.grad() : Tensor());
    return result;
  }
  void release() override {
    inputs_.clear();
    fn_ = nullptr;
  }

private:
  CheckpointFn fn_;
  std::vector<Tensor> inputs_;
};

} // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  if (!GradMode::is_enabled()) return outs;
  // Recorded even when no input requires grad: parameters inside fn still need their gradients.
  auto node = std::make_shared<CheckpointBackward>(fn, inputs);
  std::vector<const Tensor*> in_ptrs;
  for (auto& t : inputs) in_ptrs.push_back(&t);
  std::vector<Tensor*> out_ptrs;
  for (auto& t : outs) {
    VLM_CHECK(is_floating(t.dtype()), "checkpoint: output ", t.desc(), " is not floating");
    t = t.detach(); // fn may return an input itself; never rewrite the input's history
    out_ptrs.push_back(&t);
  }
  record(std::static_pointer_cast<Node>(node), in_ptrs, out_ptrs);
  return outs;
}

} // namespace vlm
