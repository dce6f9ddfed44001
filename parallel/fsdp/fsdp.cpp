#include "parallel/fsdp/fsdp.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::parallel {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements [begin, begin + n) of a flat tensor, as a flat view.
Tensor flat_slice(const Tensor& flat, int64_t begin, int64_t n) {
  return slice(flat, 0, begin, begin + n);
}

std::string mib(int64_t bytes) { return detail::str_cat(double(bytes) / double(1 << 20), " MiB"); }

// A parameter as this rank holds it before FSDP: materialized (its values; tensor parallelism
// may have split it), or only declared (its shape after the local shape TP set).
struct LocalParam {
  std::string name;
  Shape shape;
  DType dtype;
  bool trainable;
  Tensor value; // undefined when only declared
};

std::vector<LocalParam> local_params(const nn::Module& m) {
  std::vector<LocalParam> out;
  for (const nn::ParameterSpec& spec : m.parameter_specs()) {
    if (spec.materialized) {
      const Tensor t = m.find_parameter(spec.name);
      out.push_back({spec.name, t.shape(), t.dtype(), t.requires_grad(), t});
    } else {
      out.push_back({spec.name, spec.local_shape, spec.dtype, spec.trainable, {}});
    }
  }
  return out;
}

} // namespace

// One trainable parameter of a unit: its whole shape, its rows on this rank, where it lives in the
// unit's flat buffers, and the module whose slot holds it.
struct ShardedParam {
  std::string name;       // full HF name (relative to the root)
  nn::Module* owner;      // replace_parameter is called on it (the block, or the root)
  std::string local_name; // the name relative to owner
  Shape full_shape;
  int64_t rows = 1, row_numel = 1; // dim 0 and the elements of one row (a 0-dim tensor: 1 x 1)
  int64_t shard_rows = 1;          // ceil(rows / dp_shard)
  int64_t shard_offset = 0;        // in the flat shard (and flat gradient)
  int64_t full_offset = 0;         // in the full buffer
  Tensor shard;                    // leaf [shard_rows, ...] viewing the flat shard
  Tensor full;                     // this micro-step's whole parameter, viewing the full buffer
};

struct FsdpUnit {
  enum class State { sharded, gathering, unsharded };

  std::string name;
  nn::Module* module = nullptr; // null: the root unit
  int index = 0;                // in Fsdp::Impl::units (the root is 0)
  std::vector<ShardedParam> params;
  DType dtype = DType::f32, grad_dtype = DType::f32, reduce_dtype = DType::f32;
  int64_t shard_numel = 0, full_numel = 0;
  Tensor flat_shard; // [shard_numel] dtype: the shards, persistent
  Tensor flat_grad;  // [shard_numel] grad_dtype: the gradient shards of the step
  // [full_numel] grad_dtype, laid out as the whole parameters (full_offset), with more than one
  // rank: whole gradients not reduced yet — the micro-steps' before the last with
  // reduce_every_micro_step = false, and this backward's fp32 weight gradients written straight
  // from the GEMMs (bf16 units). Undefined while it holds nothing.
  Tensor whole_grad;
  std::vector<char> whole_grad_holds; // per parameter: its slot in whole_grad holds a gradient
  Tensor full_buffer; // [full_numel] dtype; released while sharded (the flat shard if 1 rank)
  // One parameter over several ranks: [rank][shard] order is its row order, so it is gathered
  // straight into full_buffer ([ranks x shard_numel], the padding rows last) and, without
  // padding, reduce-scattered straight from its gradient: no staging copy of the whole tensor.
  bool direct = false;
  State state = State::sharded;
  std::unique_ptr<Work> gather_work;
  Tensor gather_recv;
  bool reshard_after_forward = true;
  bool swapped_in = false;    // the module's slots hold the whole parameters
  bool node_recorded = false; // this micro-step's forward recorded a gather node
  bool reduced = false;       // ... and its backward reduced the gradients
  size_t wrapper = 0;
};

namespace {

// The autograd node whose outputs are a unit's whole parameters: it runs once all their gradients
// have arrived, i.e. when the unit's backward is done, and reduces them. The weight gradients of
// a bf16 unit's parameters reach it as fp32 writes straight from the GEMMs into the unit's f32
// gradient buffer (accept_direct_grad, autograd's accumulate_weight_grad) rather than as bf16
// tensors, as an unsharded bf16 parameter's reach its f32 .grad.
class FsdpGatherNode final : public Node {
public:
  FsdpGatherNode(std::weak_ptr<Fsdp::Impl> impl, FsdpUnit* unit)
      : impl_(std::move(impl)), unit_(unit) {}
  const char* name() const override { return "FsdpReduceGradients"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;
  bool accept_direct_grad(int output_nr, const GradWriter& write) override;
  bool took_direct_grad(size_t output_nr) const override {
    return output_nr < took_direct_.size() && took_direct_[output_nr];
  }

private:
  std::weak_ptr<Fsdp::Impl> impl_;
  FsdpUnit* unit_;
  std::vector<char> took_direct_; // per output (parameter), in the current backward pass
};

// Identity on a block's outputs: in backward it runs before any node of the block and gathers the
// unit's parameters again.
class FsdpPreBackwardNode final : public Node {
public:
  FsdpPreBackwardNode(std::weak_ptr<Fsdp::Impl> impl, FsdpUnit* unit)
      : impl_(std::move(impl)), unit_(unit) {}
  const char* name() const override { return "FsdpGatherForBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;

private:
  std::weak_ptr<Fsdp::Impl> impl_;
  FsdpUnit* unit_;
};

} // namespace

struct Fsdp::Impl : std::enable_shared_from_this<Fsdp::Impl> {
  nn::Module& root;
  ProcessGroup& shard;
  ProcessGroup* replicate; // null when there is no replica
  FsdpOptions options;
  Device device;
  int ranks = 1, rank = 0;
  // units[0] = the root; then the root's large parameters, a unit each; then the blocks.
  std::vector<std::unique_ptr<FsdpUnit>> units;
  int first_block = 1; // the first block's unit
  int64_t frozen_bytes = 0;

  // The micro-step.
  bool in_micro_step = false, first = false, last = false, all_whole = false;
  std::vector<FsdpUnit*> forward_order;
  struct PendingReduce {
    FsdpUnit* unit;
    std::unique_ptr<Work> work;
    Tensor out, send;
    bool into_grad = false; // out is the flat gradient (nothing to add)
  };
  std::optional<PendingReduce> pending;
  struct PendingReplicate {
    FsdpUnit* unit;
    std::unique_ptr<Work> work;
    Tensor buffer; // the all-reduced values (reduce dtype), copied into the flat gradient
  };
  std::vector<PendingReplicate> replicating;

  Impl(nn::Module& r, ProcessGroup& s, ProcessGroup* rep, const FsdpOptions& o, Device d)
      : root(r), shard(s), replicate(rep && rep->size() > 1 ? rep : nullptr), options(o), device(d),
        ranks(s.size()), rank(s.rank()) {}

  // --- building ----------------------------------------------------------------------------------

  // `value`: the parameter's values, or undefined for a parameter only declared (its shards stay
  // zero until a loader fills them); `shape`: what this rank would hold without FSDP.
  void add_param(FsdpUnit& u, const std::string& full_name, nn::Module* owner,
                 const std::string& local_name, const Shape& shape, DType dtype,
                 const Tensor& value) {
    if (u.params.empty())
      u.dtype = dtype;
    else
      VLM_CHECK(dtype == u.dtype, "FSDP unit ", u.name, ": parameter ", full_name, " is ",
                dtype_name(dtype), " but ", u.params[0].name, " is ", dtype_name(u.dtype),
                " (one dtype per unit)");
    ShardedParam p;
    p.name = full_name;
    p.owner = owner;
    p.local_name = local_name;
    p.full_shape = shape;
    p.rows = shape.empty() ? 1 : shape[0];
    p.row_numel = p.rows == 0 ? 0 : vlm::numel(shape) / p.rows;
    p.shard_rows = ceil_div(p.rows, ranks);
    p.shard_offset = u.shard_numel;
    p.full_offset = u.full_numel;
    u.shard_numel += p.shard_rows * p.row_numel;
    u.full_numel += vlm::numel(shape);
    p.full = value; // the whole value until the shards are cut from it
    u.params.push_back(std::move(p));
  }

  // Allocates the unit's buffers, cuts this rank's rows out of the whole parameters and swaps
  // the shards into the module.
  void shard_unit(FsdpUnit& u) {
    NoGradGuard no_grad;
    u.grad_dtype = u.dtype == DType::f64 ? DType::f64 : DType::f32;
    u.reduce_dtype = u.dtype == DType::f64 ? DType::f64 : options.reduce_dtype;
    u.flat_shard = Tensor::zeros({u.shard_numel}, u.dtype, device);
    u.flat_grad = Tensor::zeros({u.shard_numel}, u.grad_dtype, device);
    for (ShardedParam& p : u.params) {
      const int64_t lo = std::min(p.rows, int64_t(rank) * p.shard_rows);
      const int64_t hi = std::min(p.rows, lo + p.shard_rows);
      if (hi > lo && p.full.defined()) {
        Tensor dst = flat_slice(u.flat_shard, p.shard_offset, (hi - lo) * p.row_numel);
        copy_(dst, flat_slice(reshape(p.full.detach().contiguous(), {p.rows * p.row_numel}),
                              lo * p.row_numel, (hi - lo) * p.row_numel));
      }
      Shape shard_shape = p.full_shape.empty() ? Shape{} : p.full_shape;
      if (!shard_shape.empty()) shard_shape[0] = p.shard_rows;
      p.shard = u.flat_shard.as_strided(shard_shape, contiguous_strides(shard_shape),
                                        u.flat_shard.offset() + p.shard_offset);
      p.shard.set_requires_grad(true);
      p.full = Tensor();
      p.owner->replace_parameter(p.local_name, p.shard);
      p.shard.set_name(p.name);
    }
    if (ranks == 1) {
      u.full_buffer = u.flat_shard; // the shards are the whole parameters
      for (ShardedParam& p : u.params) p.full_offset = p.shard_offset;
    } else {
      u.direct = u.params.size() == 1;
      u.full_buffer =
          Tensor::released({u.direct ? ranks * u.shard_numel : u.full_numel}, u.dtype, device);
    }
  }

  // --- gathering ---------------------------------------------------------------------------------

  void start_gather(FsdpUnit& u) {
    if (u.state != FsdpUnit::State::sharded) return;
    if (ranks == 1) {
      u.state = FsdpUnit::State::unsharded;
      return;
    }
    if (u.direct) {
      u.full_buffer.impl().storage->reacquire();
      u.gather_recv = u.full_buffer;
    } else {
      u.gather_recv = Tensor::empty({ranks * u.shard_numel}, u.dtype, device);
    }
    u.gather_work = shard.all_gather_async(u.gather_recv, u.flat_shard);
    u.state = FsdpUnit::State::gathering;
  }

  // The unit's whole parameters in its full buffer (gathered now, or the prefetch finished).
  void finish_gather(FsdpUnit& u) {
    start_gather(u);
    if (u.state != FsdpUnit::State::gathering) return;
    u.gather_work->wait();
    u.gather_work.reset();
    if (u.direct) { // gathered in place
      u.gather_recv = Tensor();
      u.state = FsdpUnit::State::unsharded;
      return;
    }
    NoGradGuard no_grad;
    u.full_buffer.impl().storage->reacquire();
    const int64_t S = u.shard_numel;
    for (const ShardedParam& p : u.params)
      for (int r = 0; r < ranks; r++) {
        const int64_t lo = std::min(p.rows, int64_t(r) * p.shard_rows);
        const int64_t n = (std::min(p.rows, lo + p.shard_rows) - lo) * p.row_numel;
        if (n == 0) continue;
        Tensor dst = flat_slice(u.full_buffer, p.full_offset + lo * p.row_numel, n);
        copy_(dst, flat_slice(u.gather_recv, r * S + p.shard_offset, n));
      }
    u.gather_recv = Tensor();
    u.state = FsdpUnit::State::unsharded;
  }

  // Fresh whole-parameter tensors on the full buffer; with `record`, the outputs of a gather
  // node (their gradients come back to post_backward).
  void make_whole(FsdpUnit& u, bool record) {
    std::vector<Tensor*> outs;
    for (ShardedParam& p : u.params) {
      p.full = u.full_buffer.as_strided(p.full_shape, contiguous_strides(p.full_shape),
                                        u.full_buffer.offset() + p.full_offset);
      outs.push_back(&p.full);
    }
    u.node_recorded = record;
    if (record)
      vlm::record(std::make_shared<FsdpGatherNode>(weak_from_this(), &u),
                  std::vector<const Tensor*>{}, outs);
  }

  void swap_in(FsdpUnit& u) {
    if (u.swapped_in) return;
    for (ShardedParam& p : u.params) {
      p.owner->replace_parameter(p.local_name, p.full);
      p.full.set_name(p.name);
    }
    u.swapped_in = true;
  }

  void swap_out(FsdpUnit& u) {
    if (!u.swapped_in) return;
    for (ShardedParam& p : u.params) {
      p.owner->replace_parameter(p.local_name, p.shard);
      p.shard.set_name(p.name);
    }
    u.swapped_in = false;
  }

  // Back to the shards: the module's slots and, with more than one rank, the memory.
  void reshard(FsdpUnit& u) {
    swap_out(u);
    if (u.state == FsdpUnit::State::gathering) { // a prefetch nobody used
      u.gather_work->wait();
      u.gather_work.reset();
      u.gather_recv = Tensor();
    }
    if (ranks > 1) u.full_buffer.impl().storage->release();
    u.state = FsdpUnit::State::sharded;
  }

  void prefetch(int index) {
    if (!options.prefetch || index < first_block || index >= int(units.size())) return;
    start_gather(*units[size_t(index)]);
  }

  // --- forward and backward of a block unit ------------------------------------------------------

  void pre_forward(FsdpUnit& u) {
    VLM_CHECK(in_micro_step, "FSDP: block ", u.name,
              " ran outside a micro-step (Fsdp::begin_micro_step / end_micro_step; for "
              "generation or export call unshard_all first)");
    finish_gather(u);
    make_whole(u, GradMode::is_enabled());
    swap_in(u);
    forward_order.push_back(&u);
    prefetch(u.index + 1);
  }

  std::vector<Tensor> post_forward(FsdpUnit& u, std::vector<Tensor> outputs) {
    if (u.node_recorded) {
      std::vector<const Tensor*> ins;
      std::vector<Tensor> result = outputs;
      std::vector<Tensor*> outs;
      for (size_t k = 0; k < outputs.size(); k++)
        if (outputs[k].defined() && outputs[k].requires_grad()) {
          result[k] = outputs[k].detach();
          ins.push_back(&outputs[k]);
          outs.push_back(&result[k]);
        }
      if (!outs.empty())
        vlm::record(std::make_shared<FsdpPreBackwardNode>(weak_from_this(), &u), ins, outs);
      outputs = std::move(result);
    }
    if (u.reshard_after_forward) reshard(u);
    return outputs;
  }

  void pre_backward(FsdpUnit& u) {
    finish_gather(u); // the same memory the saved tensors point at
    swap_in(u);       // activation checkpointing recomputes from the slots
    auto it = std::find(forward_order.begin(), forward_order.end(), &u);
    if (it != forward_order.begin() && it != forward_order.end()) prefetch((*(it - 1))->index);
  }

  // --- gradient reduction ------------------------------------------------------------------------

  // Parameter i's slot in a buffer laid out as the whole parameters (whole_grad; with one rank
  // the flat gradient, whose shard offsets are the full offsets), as a tensor of its shape.
  static Tensor param_slot(const FsdpUnit& u, const Tensor& buffer, size_t i) {
    const ShardedParam& p = u.params[i];
    return buffer.as_strided(p.full_shape, contiguous_strides(p.full_shape),
                             buffer.offset() + p.full_offset);
  }

  // whole_grad, if it is not there yet, holding nothing (not zeroed: each slot's first write
  // overwrites it).
  void allocate_whole_grad(FsdpUnit& u) {
    if (u.whole_grad.defined()) return;
    u.whole_grad = Tensor::empty({u.full_numel}, u.grad_dtype, device);
    u.whole_grad_holds.assign(u.params.size(), 0);
  }

  // accept_direct_grad of the unit's gather node: a weight gradient of a bf16 parameter, written
  // in fp32 by the op straight into the buffer its gradients are accumulated in before the
  // reduction — with one rank the flat gradient (zeroed on a step's first micro-step: beta = 1),
  // else whole_grad (beta = 0 for a slot that holds nothing yet). False for any other unit.
  bool write_grad_directly(FsdpUnit& u, size_t i, const GradWriter& write) {
    const bool mixed = u.dtype == DType::bf16 && u.grad_dtype == DType::f32;
    // An f32 unit of one parameter (the embedding, its tied head) takes every gradient into
    // whole_grad and reduces from there: one whole-size gradient, not one per use plus their sum.
    const bool own_buffer = u.direct && u.dtype == DType::f32;
    if (!(mixed || own_buffer) || i >= u.params.size()) return false;
    NoGradGuard no_grad;
    if (ranks == 1) {
      Tensor slot = param_slot(u, u.flat_grad, i);
      write(slot, 1.f);
      return true;
    }
    allocate_whole_grad(u);
    Tensor slot = param_slot(u, u.whole_grad, i);
    write(slot, u.whole_grad_holds[i] ? 1.f : 0.f); // a parameter used twice (tied) adds
    u.whole_grad_holds[i] = 1;
    return true;
  }

  // This backward's gradients that came through the graph (undefined: all of it was written
  // directly) added into whole_grad, which afterwards holds every parameter's.
  void add_to_whole_grad(FsdpUnit& u, const std::vector<Tensor>& grads) {
    allocate_whole_grad(u);
    for (size_t i = 0; i < u.params.size(); i++) {
      Tensor slot = param_slot(u, u.whole_grad, i);
      if (!grads[i].defined()) {
        VLM_CHECK(u.whole_grad_holds[i], "FSDP unit ", u.name, ": no gradient for ",
                  u.params[i].name);
        continue;
      }
      if (u.whole_grad_holds[i])
        add_(slot, grads[i].dtype() == slot.dtype() ? grads[i] : cast(grads[i], slot.dtype()));
      else
        copy_(slot, grads[i]);
      u.whole_grad_holds[i] = 1;
    }
  }

  // The parameters' slots of whole_grad, as pack_add takes gradients.
  std::vector<Tensor> whole_grad_slots(const FsdpUnit& u) const {
    std::vector<Tensor> slots;
    for (size_t i = 0; i < u.params.size(); i++) slots.push_back(param_slot(u, u.whole_grad, i));
    return slots;
  }

  // grads of the whole parameters into [rank][shard] order, added into `dst` [ranks x S] (a
  // zeroed send buffer, or the flat gradient with one rank); an undefined gradient (written
  // straight into dst) adds nothing.
  void pack_add(const FsdpUnit& u, const std::vector<Tensor>& grads, Tensor& dst) {
    const int64_t S = u.shard_numel;
    for (size_t i = 0; i < u.params.size(); i++) {
      const ShardedParam& p = u.params[i];
      if (!grads[i].defined()) continue;
      const Tensor g = reshape(grads[i].contiguous(), {p.rows * p.row_numel});
      for (int r = 0; r < ranks; r++) {
        const int64_t lo = std::min(p.rows, int64_t(r) * p.shard_rows);
        const int64_t n = (std::min(p.rows, lo + p.shard_rows) - lo) * p.row_numel;
        if (n == 0) continue;
        Tensor piece = flat_slice(dst, r * S + p.shard_offset, n);
        const Tensor src = flat_slice(g, lo * p.row_numel, n);
        add_(piece, src.dtype() == dst.dtype() ? src : cast(src, dst.dtype()));
      }
    }
  }

  void post_backward(FsdpUnit& u, const std::vector<Tensor>& grads) {
    NoGradGuard no_grad;
    finish_pending(); // at most one reduce-scatter in flight
    reshard(u);       // its backward is done: the whole parameters' memory serves the reduction
    const bool sync = last || options.reduce_every_micro_step;
    if (ranks == 1) {
      pack_add(u, grads, u.flat_grad); // the shard is the whole gradient: no reduce-scatter
      if (last) start_replicate(u);
    } else if (!sync) {
      add_to_whole_grad(u, grads); // reduced on the last micro-step
    } else {
      // Earlier micro-steps' gradients and direct writes are summed in whole_grad (f32) first.
      if (u.whole_grad.defined()) add_to_whole_grad(u, grads);
      const std::vector<Tensor> sources = u.whole_grad.defined() ? whole_grad_slots(u) : grads;
      u.whole_grad = Tensor();
      const ShardedParam& p0 = u.params[0];
      Tensor send;
      if (u.direct && sources[0].defined() && sources[0].dtype() == u.reduce_dtype &&
          sources[0].is_contiguous() && p0.rows == int64_t(ranks) * p0.shard_rows) {
        send = reshape(sources[0], {ranks * u.shard_numel}); // its rows are [rank][shard] order
      } else {
        send = Tensor::zeros({ranks * u.shard_numel}, u.reduce_dtype, device);
        pack_add(u, sources, send);
      }
      // A step's first reduction lands in the (zero) flat gradient itself when the dtypes agree.
      const bool into_grad = first && u.reduce_dtype == u.grad_dtype;
      Tensor out = into_grad ? u.flat_grad : Tensor::empty({u.shard_numel}, u.reduce_dtype, device);
      pending = PendingReduce{&u, shard.reduce_scatter_async(out, send), out, send, into_grad};
    }
    u.reduced = true;
  }

  // The reduced shard into the flat gradient; on the last micro-step, to the replicas.
  void finish_pending() {
    if (!pending) return;
    pending->work->wait();
    FsdpUnit& u = *pending->unit;
    if (!pending->into_grad) add_(u.flat_grad, pending->out.to(u.grad_dtype));
    pending.reset();
    if (last) start_replicate(u);
  }

  void start_replicate(FsdpUnit& u) {
    if (!replicate) return;
    Tensor buffer = u.flat_grad.to(u.reduce_dtype); // the flat gradient itself in its own dtype
    replicating.push_back({&u, replicate->all_reduce_async(buffer), buffer});
  }

  void finish_replicate() {
    for (PendingReplicate& r : replicating) {
      r.work->wait();
      if (!r.buffer.same(r.unit->flat_grad)) copy_(r.unit->flat_grad, r.buffer);
    }
    replicating.clear();
  }
};

namespace {

std::vector<Tensor> FsdpGatherNode::apply(std::vector<Tensor>& grads) {
  if (auto impl = impl_.lock()) impl->post_backward(*unit_, grads);
  took_direct_.assign(took_direct_.size(), 0);
  return {};
}

bool FsdpGatherNode::accept_direct_grad(int output_nr, const GradWriter& write) {
  auto impl = impl_.lock();
  if (!impl || !impl->write_grad_directly(*unit_, size_t(output_nr), write)) return false;
  if (took_direct_.size() < outputs.size()) took_direct_.resize(outputs.size(), 0);
  took_direct_[size_t(output_nr)] = 1;
  return true;
}

std::vector<Tensor> FsdpPreBackwardNode::apply(std::vector<Tensor>& grads) {
  if (auto impl = impl_.lock()) impl->pre_backward(*unit_);
  return std::move(grads);
}

} // namespace

Fsdp::Fsdp(nn::Module& root, const std::vector<nn::Module*>& blocks, ProcessGroup& shard_group,
           ProcessGroup* replicate_group, const FsdpOptions& options, Device device)
    : impl_(std::make_shared<Impl>(root, shard_group, replicate_group, options, device)) {
  Impl& m = *impl_;
  VLM_CHECK(options.reduce_dtype == DType::f32 || options.reduce_dtype == DType::bf16,
            "FSDP: reduce dtype must be f32 or bf16, got ", dtype_name(options.reduce_dtype));
  // Where each block sits under the root.
  std::map<const nn::Module*, std::string> paths;
  for (const auto& [path, module] : root.named_modules()) paths.emplace(module, path);
  std::unordered_set<std::string> claimed; // full names (a tied parameter is listed once)
  auto unit = std::make_unique<FsdpUnit>();
  unit->name = "root";
  m.units.push_back(std::move(unit));
  for (size_t b = 0; b < blocks.size(); b++) {
    auto it = paths.find(blocks[b]);
    VLM_CHECK(it != paths.end() && !it->second.empty(), "FSDP: block ", b,
              " is not a module under the root");
    auto u = std::make_unique<FsdpUnit>();
    u->name = it->second;
    u->module = blocks[b];
    u->index = int(m.units.size());
    for (const LocalParam& p : local_params(*blocks[b])) {
      if (!claimed.insert(it->second + "." + p.name).second) continue;
      if (!p.trainable) continue; // frozen: stays whole, never communicated
      m.add_param(*u, it->second + "." + p.name, blocks[b], p.name, p.shape, p.dtype, p.value);
    }
    m.units.push_back(std::move(u));
  }
  std::vector<LocalParam> root_params;
  int64_t root_elements = 0;
  for (const LocalParam& p : local_params(root)) {
    if (!p.trainable) {
      m.frozen_bytes += vlm::numel(p.shape) * int64_t(dtype_size(p.dtype));
      continue;
    }
    if (!claimed.insert(p.name).second) continue;
    root_params.push_back(p);
    root_elements += vlm::numel(p.shape);
  }
  // A root parameter with a quarter of the root's elements or more (the embedding, an untied
  // head) is a unit of its own: gathered and reduced in place (FsdpUnit::direct), it never needs
  // a second whole-size buffer, which for a 150k-token vocabulary is hundreds of MiB.
  std::vector<std::unique_ptr<FsdpUnit>> own;
  for (const LocalParam& p : root_params) {
    if (root_params.size() > 1 && 4 * vlm::numel(p.shape) >= root_elements) {
      own.push_back(std::make_unique<FsdpUnit>());
      own.back()->name = p.name;
      m.add_param(*own.back(), p.name, &root, p.name, p.shape, p.dtype, p.value);
    } else {
      m.add_param(*m.units[0], p.name, &root, p.name, p.shape, p.dtype, p.value);
    }
  }
  m.first_block = int(1 + own.size());
  m.units.insert(m.units.begin() + 1, std::make_move_iterator(own.begin()),
                 std::make_move_iterator(own.end()));
  for (size_t i = 0; i < m.units.size(); i++) m.units[i]->index = int(i);
  for (auto& u : m.units) {
    m.shard_unit(*u);
    u->reshard_after_forward = options.reshard_after_forward;
  }
  // The last block's backward comes right after the forward: keep it whole (torchtitan does).
  if (m.units.size() > 1) m.units.back()->reshard_after_forward = false;
  std::weak_ptr<Impl> weak = impl_;
  for (size_t i = size_t(m.first_block); i < m.units.size(); i++) {
    FsdpUnit* u = m.units[i].get();
    if (u->params.empty()) continue; // a frozen block: nothing to gather
    u->wrapper = u->module->add_forward_wrapper(
        [weak, u](const nn::Module::Forward& forward, const std::vector<Tensor>& inputs) {
          auto impl = weak.lock();
          if (!impl || impl->all_whole) return forward(inputs);
          impl->pre_forward(*u);
          return impl->post_forward(*u, forward(inputs));
        });
  }
}

Fsdp::~Fsdp() {
  for (auto& u : impl_->units)
    if (u->wrapper) u->module->remove_forward_hook(u->wrapper);
}

void Fsdp::begin_micro_step(bool first, bool last) {
  Impl& m = *impl_;
  VLM_CHECK(!m.in_micro_step, "FSDP: begin_micro_step twice without end_micro_step");
  VLM_CHECK(!m.all_whole, "FSDP: begin_micro_step while unshard_all() holds the whole model");
  m.in_micro_step = true;
  m.first = first;
  m.last = last;
  if (first)
    for (auto& u : m.units) {
      fill_(u->flat_grad, 0.0);
      u->whole_grad = Tensor(); // left over only by a step that did not reach its last micro-step
      for (ShardedParam& p : u->params)
        p.shard.set_grad(u->flat_grad.as_strided(p.shard.shape(), p.shard.strides(),
                                                 u->flat_grad.offset() + p.shard_offset));
    }
  m.forward_order.clear();
  for (int i = 0; i < m.first_block; i++) m.start_gather(*m.units[size_t(i)]);
  for (int i = 0; i < m.first_block; i++) { // whole until their backward ends
    FsdpUnit& u = *m.units[size_t(i)];
    m.finish_gather(u);
    m.make_whole(u, GradMode::is_enabled() && !u.params.empty());
    m.swap_in(u);
    m.forward_order.push_back(&u);
  }
  m.prefetch(m.first_block);
}

void Fsdp::end_micro_step() {
  Impl& m = *impl_;
  VLM_CHECK(m.in_micro_step, "FSDP: end_micro_step without begin_micro_step");
  m.in_micro_step = false; // also when the checks below throw
  m.finish_pending();
  m.finish_replicate();
  for (auto& u : m.units) {
    VLM_CHECK(!u->node_recorded || u->reduced || u->params.empty(), "FSDP: unit ", u->name,
              " ran its forward with gradients but received none in this micro-step's backward: "
              "every unit must reach the loss on every rank (was backward skipped, or a block's "
              "output left unused?)");
    m.reshard(*u);
    u->node_recorded = u->reduced = false;
    for (ShardedParam& p : u->params) p.full = Tensor();
  }
  m.forward_order.clear();
}

void Fsdp::unshard_all() {
  Impl& m = *impl_;
  VLM_CHECK(!m.in_micro_step, "FSDP: unshard_all inside a micro-step");
  if (m.all_whole) return;
  for (auto& u : m.units) m.start_gather(*u);
  for (auto& u : m.units) {
    m.finish_gather(*u);
    m.make_whole(*u, false);
    m.swap_in(*u);
  }
  m.all_whole = true;
}

void Fsdp::reshard_all() {
  Impl& m = *impl_;
  if (!m.all_whole) return;
  for (auto& u : m.units) {
    m.reshard(*u);
    for (ShardedParam& p : u->params) p.full = Tensor();
  }
  m.all_whole = false;
}

ProcessGroup& Fsdp::shard_group() const { return impl_->shard; }

std::map<std::string, ShardRows> Fsdp::shard_rows() const {
  const Impl& m = *impl_;
  std::map<std::string, ShardRows> out;
  for (const auto& u : m.units)
    for (const ShardedParam& p : u->params) {
      const int64_t lo = std::min(p.rows, int64_t(m.rank) * p.shard_rows);
      out[p.name] = {p.full_shape, lo, std::min(p.rows, lo + p.shard_rows) - lo,
                     !m.replicate || m.replicate->rank() == 0};
    }
  return out;
}

FsdpMemory Fsdp::memory() const {
  const Impl& m = *impl_;
  FsdpMemory r;
  r.param_bytes = m.frozen_bytes;
  r.full_param_bytes = m.frozen_bytes;
  for (const auto& u : m.units) {
    const int64_t size = int64_t(dtype_size(u->dtype)), gsize = int64_t(dtype_size(u->grad_dtype));
    r.param_bytes += u->shard_numel * size;
    r.grad_bytes += u->shard_numel * gsize;
    if (u->whole_grad.defined()) r.grad_bytes += int64_t(u->whole_grad.nbytes());
    r.full_param_bytes += u->full_numel * size;
    r.full_grad_bytes += u->full_numel * gsize;
    r.trainable_elements += u->full_numel;
    r.shard_elements += u->shard_numel;
  }
  return r;
}

std::vector<std::string> Fsdp::describe_units() const {
  std::vector<std::string> out;
  for (const auto& u : impl_->units)
    out.push_back(detail::str_cat(u->name, " (", u->params.size(), " parameters, shard ",
                                  mib(u->shard_numel * int64_t(dtype_size(u->dtype))), ")"));
  return out;
}

} // namespace vlm::parallel
