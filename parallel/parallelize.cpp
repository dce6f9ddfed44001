#include "parallel/parallelize.h"

#include <map>

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"
#include "src/optim/grad_clip.h"

namespace vlm::parallel {

ParallelGroups ParallelGroups::of(const DeviceMesh& mesh) {
  return {&mesh.dp_shard(), &mesh.dp_replicate(), &mesh.dp(), &mesh.tp()};
}

Parallelized::~Parallelized() { undo(); }

Parallelized::Parallelized(Parallelized&& other) noexcept
    : tp_(std::move(other.tp_)), fsdp_(std::move(other.fsdp_)),
      ac_wrappers_(std::move(other.ac_wrappers_)), dp_(other.dp_) {
  other.ac_wrappers_.clear();
  other.dp_ = nullptr;
}

Parallelized& Parallelized::operator=(Parallelized&& other) noexcept {
  if (this == &other) return *this;
  undo();
  tp_ = std::move(other.tp_);
  fsdp_ = std::move(other.fsdp_);
  ac_wrappers_ = std::move(other.ac_wrappers_);
  dp_ = other.dp_;
  other.ac_wrappers_.clear();
  other.dp_ = nullptr;
  return *this;
}

void Parallelized::undo() {
  fsdp_.reset(); // the outer wrappers first
  for (auto it = ac_wrappers_.rbegin(); it != ac_wrappers_.rend(); ++it)
    it->first->remove_forward_hook(it->second);
  ac_wrappers_.clear();
  tp_.reset(); // the innermost wrappers last
  dp_ = nullptr;
}

void Parallelized::unshard_all() const {
  if (fsdp_) fsdp_->unshard_all(); // each rank's TP part whole, then the parts together
  if (tp_) tp_->gather_all();
}

void Parallelized::reshard_all() const {
  if (tp_) tp_->split_all();
  if (fsdp_) fsdp_->reshard_all();
}

const Parallelized& Parallelized::none() {
  static const Parallelized empty;
  return empty;
}

void Parallelized::begin_micro_step(bool first, bool last) const {
  if (fsdp_) fsdp_->begin_micro_step(first, last);
}

void Parallelized::end_micro_step() const {
  if (fsdp_) fsdp_->end_micro_step();
}

void Parallelized::finish_gradients(const nn::Module& root) const {
  if (tp_) tp_->reduce_grads(root);
}

Parallelized::NormGroups Parallelized::norm_groups(const std::vector<Tensor>& trainable) const {
  if (!tp_) return {{{1.0, trainable}}};
  std::map<int64_t, std::vector<Tensor>> by_replicas;
  for (const Tensor& p : trainable) by_replicas[tp_->placement(p.name()).replicas].push_back(p);
  NormGroups out;
  for (auto& [replicas, params] : by_replicas)
    out.groups.emplace_back(1.0 / double(replicas), std::move(params));
  return out;
}

Tensor Parallelized::local_grad_norm_sq(const NormGroups& groups) const {
  if (groups.groups.size() == 1 && groups.groups[0].first == 1.0)
    return optim::clip_grad_norm_async(groups.groups[0].second, 0.0);
  NoGradGuard no_grad;
  Tensor sum;
  for (const auto& [weight, params] : groups.groups) {
    const Tensor part = affine(slice(optim::clip_grad_norm_async(params, 0.0), 0, 0, 1), weight);
    sum = sum.defined() ? add(sum, part) : part;
  }
  return sum;
}

void Parallelized::sum_grad_norm_sq(const Tensor& norm_sq) const {
  if (fsdp_) fsdp_->shard_group().all_reduce(norm_sq);
  if (tp_) tp_->group().all_reduce(norm_sq);
}

int64_t Parallelized::sum_over_dp(int64_t v) const { return dp_ ? dp_->all_reduce_value(v) : v; }

double Parallelized::sum_over_dp(double v) const { return dp_ ? dp_->all_reduce_value(v) : v; }

void Parallelized::max_over_dp(const Tensor& t) const {
  if (dp_) dp_->all_reduce(t, ReduceOp::max);
}

const VocabSplit* Parallelized::loss_split() const {
  return tp_ && tp_->vocab_parallel_head() ? &tp_->loss_split() : nullptr;
}

Parallelized parallelize(nn::Module& root, const std::vector<nn::Module*>& blocks,
                         const ParallelGroups& groups, const ParallelizeOptions& options,
                         Device device) {
  Parallelized p;
  // 1. Tensor parallelism, before anything wraps the blocks.
  if (groups.tp && groups.tp->size() > 1)
    p.tp_ = std::make_unique<TensorParallel>(root, options.tp_plan, *groups.tp,
                                             options.sequence_parallel);
  // 2. Activation checkpointing.
  const std::vector<size_t> handles = apply_activation_checkpointing(blocks, options.ac);
  for (size_t i = 0; i < handles.size(); i++) p.ac_wrappers_.emplace_back(blocks[i], handles[i]);
  // 3. FSDP, outermost.
  if (groups.shard)
    p.fsdp_ =
        std::make_unique<Fsdp>(root, blocks, *groups.shard, groups.replicate, options.fsdp, device);
  p.dp_ = groups.dp;
  // What FSDP did not shard (all of it without FSDP), on the device: a declared parameter
  // allocated there in its local shape, a materialized one moved. FSDP's shards are there already.
  root.materialize(device);
  root.to(device);
  return p;
}

Parallelized parallelize(nn::Module& root, const std::vector<nn::Module*>& blocks,
                         const DeviceMesh& mesh, const ParallelizeOptions& options, Device device) {
  ParallelGroups groups;
  if (mesh.shape().dp() > 1) groups = ParallelGroups::of(mesh);
  groups.tp = &mesh.tp();
  return parallelize(root, blocks, groups, options, device);
}

} // namespace vlm::parallel
