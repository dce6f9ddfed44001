#include "parallel/parallelize.h"

#include "src/base/check.h"

namespace vlm::parallel {

DataParallelGroups DataParallelGroups::of(const DeviceMesh& mesh) {
  return {&mesh.dp_shard(), &mesh.dp_replicate(), &mesh.dp()};
}

Parallelized::~Parallelized() { undo(); }

Parallelized::Parallelized(Parallelized&& other) noexcept
    : fsdp_(std::move(other.fsdp_)), ac_wrappers_(std::move(other.ac_wrappers_)), dp_(other.dp_) {
  other.ac_wrappers_.clear();
  other.dp_ = nullptr;
}

Parallelized& Parallelized::operator=(Parallelized&& other) noexcept {
  if (this == &other) return *this;
  undo();
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
  dp_ = nullptr;
}

Parallelized parallelize(nn::Module& root, const std::vector<nn::Module*>& blocks,
                         const DataParallelGroups& groups, const ParallelizeOptions& options,
                         Device device) {
  Parallelized p;
  // 1. Tensor parallelism goes here, before anything wraps the blocks.
  // 2. Activation checkpointing.
  const std::vector<size_t> handles = apply_activation_checkpointing(blocks, options.ac);
  for (size_t i = 0; i < handles.size(); i++) p.ac_wrappers_.emplace_back(blocks[i], handles[i]);
  // 3. FSDP, outermost.
  if (groups.shard)
    p.fsdp_ =
        std::make_unique<Fsdp>(root, blocks, *groups.shard, groups.replicate, options.fsdp, device);
  p.dp_ = groups.dp;
  root.to(device); // what FSDP did not shard (all of it without FSDP); its shards are there already
  return p;
}

Parallelized parallelize(nn::Module& root, const std::vector<nn::Module*>& blocks,
                         const DeviceMesh& mesh, const ParallelizeOptions& options, Device device) {
  VLM_CHECK(mesh.shape().tp == 1, "parallelize: tensor parallelism (", mesh.shape().str(),
            ") is not implemented yet");
  return parallelize(root, blocks,
                     mesh.shape().dp() > 1 ? DataParallelGroups::of(mesh) : DataParallelGroups{},
                     options, device);
}

} // namespace vlm::parallel
