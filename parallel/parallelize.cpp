#include "parallel/parallelize.h"

#include "src/base/check.h"

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
