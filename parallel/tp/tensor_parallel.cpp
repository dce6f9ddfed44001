#include "parallel/tp/tensor_parallel.h"

#include <algorithm>
#include <set>

#include "parallel/tp/tensor_parallel_ops.h"
#include "parallel/tp/vocab_parallel.h"
#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/shape_ops.h"
#include "src/nn/embedding.h"
#include "src/nn/linear.h"

namespace vlm::parallel {

// What the wrappers share. The input of the parallel region is entered once per input tensor:
// the projections that read the same tensor (q, k, v; gate, up; GDN's four) share one
// copy_to_tp (under sequence parallelism one all-gather), so backward sums their input gradients
// first and reduces once. A row-parallel projection (the region's end) forgets it, so nothing
// outlives the block. While the model is gathered the wrappers run the plain layers.
struct TensorParallel::State {
  Tensor in, out;
  // The rows of the sequence region's last call (sequence parallel): what the all-gathers give
  // back, also when activation checkpointing recomputes a layer in backward.
  int64_t rows = -1;
  bool gathered = false;
  Tensor enter(const Tensor& x, ProcessGroup& tp, bool split_rows) {
    if (!in.defined() || !in.same(x)) {
      in = x;
      out = split_rows ? gather_rows_to_tp(x, rows, tp) : copy_to_tp(x, tp);
    }
    return out;
  }
  void leave() { in = out = Tensor(); }
};

namespace {

// Rank r's ranges of `segments` and their replica count (see the header).
TpPlacement split_placement(const std::string& name, const Shape& shape, int64_t dim,
                            const std::vector<TpSegment>& segments, int64_t tp, int64_t r) {
  VLM_CHECK(dim >= 0 && dim < int64_t(shape.size()), "tensor parallel: ", name, " of shape ",
            shape_str(shape), " has no dim ", dim);
  TpPlacement p;
  p.global_shape = shape;
  p.dim = dim;
  int64_t offset = 0, replicas = -1;
  for (const TpSegment& s : segments) {
    VLM_CHECK(s.parts > 0 && s.size > 0 && s.size % s.parts == 0, "tensor parallel: ", name,
              ": a segment of ", s.size, " rows cannot hold ", s.parts, " equal parts");
    const int64_t unit = s.size / s.parts;
    int64_t seg_replicas = 1;
    if (s.parts >= tp) {
      VLM_CHECK(s.parts % tp == 0, "tensor parallel: ", name, ": ", s.parts,
                " heads (or rows) do not split over tp = ", tp,
                " ranks; set parallel.tp_size to a divisor of ", s.parts);
      const int64_t per = s.parts / tp;
      p.ranges.emplace_back(offset + r * per * unit, per * unit);
    } else {
      VLM_CHECK(tp % s.parts == 0, "tensor parallel: ", name, ": ", s.parts,
                " heads cannot be shared evenly by tp = ", tp,
                " ranks; set parallel.tp_size to a divisor or a multiple of ", s.parts);
      seg_replicas = tp / s.parts;
      p.ranges.emplace_back(offset + (r / seg_replicas) * unit, unit);
    }
    VLM_CHECK(replicas < 0 || replicas == seg_replicas, "tensor parallel: ", name,
              ": its segments would be replicated over different numbers of ranks (",
              shape_str(shape), ", tp = ", tp,
              "); a Gated DeltaNet needs its key heads divisible by tp");
    replicas = seg_replicas;
    offset += s.size;
  }
  VLM_CHECK(offset == shape[size_t(dim)], "tensor parallel: ", name, ": the plan's segments cover ",
            offset, " of dim ", dim, " of ", shape_str(shape));
  p.replicas = replicas;
  return p;
}

} // namespace

TensorParallel::TensorParallel(nn::Module& root, const TpPlan& plan, ProcessGroup& tp,
                               bool sequence_parallel)
    : root_(&root), tp_(&tp), state_(std::make_shared<State>()),
      sequence_parallel_(sequence_parallel) {
  VLM_CHECK(!sequence_parallel || !plan.sequence_region.empty(),
            "tensor parallel: this model's plan names no layers to split by tokens; set "
            "parallel.sequence_parallel = false");
  std::set<std::string> declared_only; // described, not allocated: only its part will be
  for (const nn::ParameterSpec& p : root.parameter_specs()) {
    placements_[p.name] = {p.shape, -1, {}, tp.size(), false};
    if (!p.materialized) declared_only.insert(p.name);
  }
  declared_only_ = &declared_only;
  const std::string region = sequence_parallel ? plan.sequence_region + "." : std::string();
  for (const TpPlan::Module& m : plan.modules)
    apply_style(m, sequence_parallel && m.path.rfind(region, 0) == 0);
  for (const TpPlan::Param& p : plan.params) split(p.name, p.dim, p.segments);
  if (!plan.head.empty()) split_head(plan.head);
  for (const std::string& name : plan.partial_grads) mark_partial_grad(name);
  if (sequence_parallel) split_sequence_region(plan.sequence_region);
  declared_only_ = nullptr;
  for (const auto& [name, p] : placements_)
    if (p.sharded() && p.replicas > 1) replica_group(p.replicas);
}

void TensorParallel::split(const std::string& name, int64_t dim,
                           const std::vector<TpSegment>& segments) {
  auto it = placements_.find(name);
  VLM_CHECK(it != placements_.end(), "tensor parallel: the plan names ", name,
            ", which the model does not have");
  VLM_CHECK(!it->second.sharded(), "tensor parallel: ", name, " is split twice by the plan");
  TpPlacement placement =
      split_placement(name, it->second.global_shape, dim, segments, tp_->size(), tp_->rank());
  if (declared_only_->count(name)) { // only the part's shape: it is allocated split
    Shape local_shape = placement.global_shape;
    local_shape[size_t(dim)] = 0;
    for (const auto& range : placement.ranges) local_shape[size_t(dim)] += range.second;
    root_->set_local_shape(name, local_shape);
    it->second = std::move(placement);
    return;
  }
  const Tensor full = root_->find_parameter(name);
  Tensor local;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> pieces;
    for (const auto& [begin, length] : placement.ranges)
      pieces.push_back(slice(full, dim, begin, begin + length));
    local = (pieces.size() == 1 ? copy(pieces[0]) : concat(pieces, dim)).detach();
  }
  local.set_requires_grad(full.requires_grad());
  if (full.grad_dtype() != full.dtype()) local.set_grad_dtype(full.grad_dtype());
  root_->replace_parameter(name, local);
  it->second = std::move(placement);
}

void TensorParallel::apply_style(const TpPlan::Module& m, bool rows_split) {
  nn::Module& module = root_->find_module(m.path);
  const std::string prefix = m.path.empty() ? "" : m.path + ".";
  if (m.style == TpStyle::vocab) {
    auto* emb = dynamic_cast<nn::Embedding*>(&module);
    VLM_CHECK(emb, "tensor parallel: ", m.path, " is a ", module.type_name(), ", not an Embedding");
    return vocab_parallel(*emb, prefix);
  }
  auto* lin = dynamic_cast<nn::Linear*>(&module);
  VLM_CHECK(lin, "tensor parallel: ", m.path, " is a ", module.type_name(), ", not a Linear");
  const int64_t T = tp_->size();
  if (m.optional && !std::all_of(m.segments.begin(), m.segments.end(),
                                 [&](const TpSegment& s) { return s.parts % T == 0; })) {
    // Inside the split rows a whole pair would attend over the rank's rows only.
    VLM_CHECK(!rows_split, "tensor parallel: ", m.path,
              " cannot stay whole under sequence parallelism; set parallel.tp_size to a "
              "divisor of its heads");
    left_whole_.push_back(m.path);
    return;
  }
  if (m.style == TpStyle::colwise)
    colwise_parallel(*lin, prefix, m.segments, rows_split);
  else
    rowwise_parallel(*lin, prefix, m.segments, rows_split);
}

// The embedding's rows split by vocabulary; the lookup sums the ranks' parts.
void TensorParallel::vocab_parallel(nn::Embedding& emb, const std::string& prefix) {
  const int64_t V = placements_.at(prefix + "weight").global_shape[0];
  split(prefix + "weight", 0, {{V, V}});
  const int64_t begin = tp_->rank() * (V / tp_->size());
  ProcessGroup* group = tp_;
  nn::Embedding* e = &emb;
  wrappers_.emplace_back(e, e->add_forward_wrapper([e, group, begin, state = state_](
                                                       const nn::Module::Forward& forward,
                                                       const std::vector<Tensor>& in) {
    if (state->gathered) return forward(in);
    return std::vector{vocab_parallel_embedding(e->weight(), in[0], begin, *group)};
  }));
}

// Output rows split; the input enters the parallel region (once per input tensor).
void TensorParallel::colwise_parallel(nn::Linear& lin, const std::string& prefix,
                                      const std::vector<TpSegment>& segments, bool rows_split) {
  split(prefix + "weight", 0, segments);
  if (lin.has_param("bias")) split(prefix + "bias", 0, segments);
  ProcessGroup* group = tp_;
  wrappers_.emplace_back(&lin, lin.add_forward_wrapper([state = state_, group, rows_split](
                                                           const nn::Module::Forward& forward,
                                                           const std::vector<Tensor>& in) {
    if (state->gathered) return forward(in);
    return forward({state->enter(in[0], *group, rows_split)});
  }));
}

// Input columns split; each rank's product is a partial sum, summed (or reduce-scattered by
// rows) before the replicated bias is added once.
void TensorParallel::rowwise_parallel(nn::Linear& lin, const std::string& prefix,
                                      const std::vector<TpSegment>& segments, bool rows_split) {
  split(prefix + "weight", 1, segments);
  // Shared columns would be summed once per sharing rank.
  VLM_CHECK(placements_.at(prefix + "weight").replicas == 1,
            "tensor parallel: ", prefix.substr(0, prefix.size() - 1), ": its ", segments[0].parts,
            " heads (or rows) are fewer than tp = ", tp_->size(),
            " ranks; a row-parallel projection needs at least one per rank");
  ProcessGroup* group = tp_;
  nn::Linear* l = &lin;
  wrappers_.emplace_back(l, l->add_forward_wrapper([state = state_, group, l,
                                                    rows_split](const nn::Module::Forward& forward,
                                                                const std::vector<Tensor>& in) {
    if (state->gathered) return forward(in);
    state->leave();
    const Tensor partial = linear(in[0], l->weight());
    Tensor y = rows_split ? reduce_scatter_rows(partial, *group) : reduce_from_tp(partial, *group);
    if (l->bias().defined()) y = add(y, l->bias());
    return std::vector{y};
  }));
}

// An untied head split by vocabulary like the embedding (a tied one was split with it).
void TensorParallel::split_head(const std::string& head) {
  const auto it = placements_.find(head);
  VLM_CHECK(it != placements_.end(), "tensor parallel: the plan's head ", head,
            " is not a parameter of the model");
  if (!it->second.sharded()) {
    const int64_t V = it->second.global_shape[0];
    split(head, 0, {{V, V}});
  }
  VLM_CHECK(it->second.ranges.size() == 1 && it->second.replicas == 1, "tensor parallel: ", head,
            ": the head's vocabulary must split evenly");
  vocab_parallel_head_ = true;
  ProcessGroup* group = tp_;
  loss_split_.vocab_begin = it->second.ranges[0].first;
  loss_split_.vocab = it->second.global_shape[0];
  loss_split_.sum = [group](const Tensor& t) { group->all_reduce(t, ReduceOp::sum); };
  loss_split_.max = [group](const Tensor& t) { group->all_reduce(t, ReduceOp::max); };
}

void TensorParallel::mark_partial_grad(const std::string& name) {
  auto it = placements_.find(name);
  VLM_CHECK(it != placements_.end(), "tensor parallel: the plan names ", name,
            ", which the model does not have");
  VLM_CHECK(!it->second.sharded(), "tensor parallel: ", name,
            " is split; only replicated weights have partial gradients");
  it->second.partial_grad = true;
}

// The region's inputs enter as each rank's block of rows and its output is gathered whole; its
// replicated weights (norms, row-parallel biases) see the rank's rows only.
void TensorParallel::split_sequence_region(const std::string& path) {
  const std::string region = path + ".";
  for (auto& [name, p] : placements_)
    if (name.rfind(region, 0) == 0 && !p.sharded()) p.partial_grad = true;
  nn::Module& module = root_->find_module(path);
  ProcessGroup* group = tp_;
  wrappers_.emplace_back(&module, module.add_forward_wrapper([state = state_, group](
                                                                 const nn::Module::Forward& forward,
                                                                 const std::vector<Tensor>& in) {
    if (state->gathered) return forward(in);
    const int64_t rows = in[0].size(0);
    std::vector<Tensor> blocks;
    for (const Tensor& x : in) {
      VLM_CHECK(x.size(0) == rows, "sequence parallel: the region's inputs must share their ", rows,
                " rows, got ", x.desc());
      blocks.push_back(split_rows(x, *group));
    }
    state->rows = rows;
    const std::vector<Tensor> out = forward(blocks);
    state->leave();
    return std::vector{gather_rows(out[0], rows, *group)};
  }));
}

TensorParallel::~TensorParallel() {
  for (auto it = wrappers_.rbegin(); it != wrappers_.rend(); ++it)
    it->first->remove_forward_hook(it->second);
}

const TpPlacement& TensorParallel::placement(const std::string& name) const {
  const auto it = placements_.find(name);
  VLM_CHECK(it != placements_.end(), "tensor parallel: no parameter ", name);
  return it->second;
}

ProcessGroup& TensorParallel::replica_group(int64_t replicas) {
  auto& g = replica_groups_[replicas];
  if (!g) // consecutive ranks share a unit (split_placement)
    g = tp_->split(int(tp_->rank() / replicas), tp_->rank(),
                   "tp_replicas_" + std::to_string(replicas));
  return *g;
}

bool TensorParallel::gathered() const { return state_->gathered; }

void TensorParallel::gather_all() {
  VLM_CHECK(!state_->gathered, "tensor parallel: gather_all() twice");
  NoGradGuard no_grad;
  for (const auto& [name, p] : placements_) {
    if (!p.sharded()) continue;
    const Tensor part = root_->find_parameter(name);
    // Each part in its place, from the first of its replicas only, zeros elsewhere: the sum over
    // the group is the whole tensor, bit for bit.
    Tensor whole = Tensor::zeros(p.global_shape, part.dtype(), part.device());
    if (tp_->rank() % p.replicas == 0) {
      int64_t local = 0;
      for (const auto& [begin, length] : p.ranges) {
        Tensor dst = slice(whole, p.dim, begin, begin + length);
        copy_(dst, slice(part.detach(), p.dim, local, local + length));
        local += length;
      }
    }
    tp_->all_reduce(whole);
    whole.set_requires_grad(part.requires_grad());
    parts_[name] = part;
    root_->replace_parameter(name, whole);
  }
  state_->gathered = true;
}

void TensorParallel::split_all() {
  VLM_CHECK(state_->gathered, "tensor parallel: split_all() without gather_all()");
  for (const auto& [name, part] : parts_) root_->replace_parameter(name, part);
  parts_.clear();
  state_->gathered = false;
}

void TensorParallel::reduce_grads(const nn::Module& root) const {
  for (const auto& [name, p] : placements_) {
    ProcessGroup* group = nullptr;
    if (p.partial_grad)
      group = tp_;
    else if (p.sharded() && p.replicas > 1)
      group = replica_groups_.at(p.replicas).get();
    if (!group) continue;
    const Tensor param = root.find_parameter(name);
    if (!param.requires_grad() || !param.grad().defined()) continue;
    group->all_reduce(param.grad());
  }
}

} // namespace vlm::parallel
