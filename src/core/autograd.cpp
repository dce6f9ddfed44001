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
  VLM_CHECK(g.shape() == leaf.shape(), "gradient ", g.desc(), " for leaf ", leaf.name(), " ",
            leaf.desc(), " has the wrong shape");
  auto& meta = leaf.autograd_meta();
  if (!meta.grad.defined()) {
    // Own a private copy: the incoming tensor may also be another tensor's gradient (a cast
    // makes one already).
    const DType dtype = leaf.grad_dtype();
    meta.grad = g.dtype() == dtype ? g.clone() : g.to(dtype);
  } else {
    add_(meta.grad, g.to(meta.grad.dtype()));
  }
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf);
  return {};
}

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                  bool retain_graph) {
  VLM_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(),
            " gradients");
  NoGradGuard no_grad; // backward formulas are not themselves recorded

  // Root gradients, keyed by the node that receives them.
  struct Buffer {
    std::vector<Tensor> grads;
  };
  std::unordered_map<Node*, Buffer> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  auto deposit = [&](const std::shared_ptr<Node>& fn, int slot, const Tensor& g) {
    auto& buf = buffers[fn.get()].grads;
    if (buf.size() < fn->outputs.size()) buf.resize(fn->outputs.size());
    if (!buf[slot].defined())
      buf[slot] = g;
    else
      buf[slot] = add(buf[slot], g);
  };

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
    deposit(e.fn, e.input_nr, g);
    root_nodes.push_back(e.fn);
  }

  // Dependency counts: how many edges point at each node among those reachable from the roots.
  std::unordered_map<Node*, int> deps;
  {
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
  }

  // Ready nodes run latest-created first, which frees activations in reverse forward order.
  auto later = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later)>
      ready(later);
  {
    std::unordered_map<Node*, bool> queued;
    for (auto& n : root_nodes)
      if (deps[n.get()] == 0 && !queued[n.get()]) {
        queued[n.get()] = true;
        ready.push(n);
      }
  }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    auto it = buffers.find(node.get());
    std::vector<Tensor> gin =
        it != buffers.end() ? std::move(it->second.grads) : std::vector<Tensor>{};
    if (it != buffers.end()) buffers.erase(it);
    gin.resize(std::max<size_t>(node->outputs.size(), gin.size()));
    for (size_t k = 0; k < node->outputs.size(); k++)
      if (!gin[k].defined()) {
        auto& m = node->outputs[k];
        gin[k] = Tensor::zeros(m.shape, m.dtype, m.device);
      }

    std::vector<Tensor> gout = node->apply(gin);
    if (!retain_graph) node->release();
    gin.clear();

    VLM_CHECK(gout.empty() || gout.size() == node->next_edges.size(), node->name(), " returned ",
              gout.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t k = 0; k < node->next_edges.size(); k++) {
      const Edge& e = node->next_edges[k];
      if (!e.fn) continue;
      if (k < gout.size() && gout[k].defined()) {
        const Shape& expected = e.fn->outputs[e.input_nr].shape;
        VLM_CHECK(gout[k].shape() == expected, node->name(), ": gradient for input ", k, " is ",
                  gout[k].desc(), " but the input has shape ", shape_str(expected));
        deposit(e.fn, e.input_nr, gout[k]);
      }
      if (--deps[e.fn.get()] == 0) ready.push(e.fn);
    }
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
