#include "parallel/comm/mesh.h"

#include "src/base/check.h"

namespace vlm::parallel {

std::string MeshShape::str() const {
  return detail::str_cat("dp_replicate ", dp_replicate, " x dp_shard ", dp_shard, " x tp ", tp);
}

MeshShape resolve_mesh_shape(int64_t world, int64_t dp_replicate, int64_t dp_shard, int64_t tp,
                             bool sharded) {
  VLM_CHECK(world >= 1, "parallel: the job has ", world, " ranks");
  VLM_CHECK(tp >= 1, "parallel.tp_size = ", tp, ": must be >= 1");
  VLM_CHECK(dp_replicate >= 0 && dp_shard >= 0, "parallel.dp_replicate = ", dp_replicate,
            ", parallel.dp_shard = ", dp_shard, ": must be >= 1, or 0 for the ranks that are left");
  VLM_CHECK(world % tp == 0, "parallel.tp_size = ", tp, " does not divide the job's ", world,
            " ranks");
  const int64_t dp = world / tp;
  MeshShape m;
  m.tp = tp;
  if (!sharded) {
    VLM_CHECK(dp_shard <= 1,
              "parallel.data_parallel = \"ddp\" keeps the whole model on every rank, "
              "so parallel.dp_shard must be 1 (or 0), not ",
              dp_shard, "; use data_parallel = \"fsdp\" to shard it");
    m.dp_shard = 1;
    m.dp_replicate = dp_replicate == 0 ? dp : dp_replicate;
  } else if (dp_replicate == 0 && dp_shard == 0) {
    m.dp_replicate = 1;
    m.dp_shard = dp;
  } else if (dp_replicate == 0) {
    VLM_CHECK(dp % dp_shard == 0, "parallel.dp_shard = ", dp_shard, " does not divide the ", dp,
              " data-parallel ranks (", world, " ranks / tp_size ", tp, ")");
    m.dp_shard = dp_shard;
    m.dp_replicate = dp / dp_shard;
  } else if (dp_shard == 0) {
    VLM_CHECK(dp % dp_replicate == 0, "parallel.dp_replicate = ", dp_replicate,
              " does not divide the ", dp, " data-parallel ranks (", world, " ranks / tp_size ", tp,
              ")");
    m.dp_replicate = dp_replicate;
    m.dp_shard = dp / dp_replicate;
  } else {
    m.dp_replicate = dp_replicate;
    m.dp_shard = dp_shard;
  }
  // The product without overflow: huge factors must not wrap around to the job's size.
  int64_t dp_ranks = 0, total = 0;
  const bool overflow = __builtin_mul_overflow(m.dp_replicate, m.dp_shard, &dp_ranks) ||
                        __builtin_mul_overflow(dp_ranks, m.tp, &total);
  VLM_CHECK(!overflow && total == world, "parallel: dp_replicate ", m.dp_replicate, " x dp_shard ",
            m.dp_shard, " x tp_size ", m.tp,
            overflow ? " overflows" : " = " + std::to_string(total), " ranks, but the job has ",
            world);
  return m;
}

DeviceMesh::DeviceMesh(std::unique_ptr<ProcessGroup> world, const MeshShape& shape)
    : shape_(shape), world_(std::move(world)) {
  VLM_CHECK(world_->size() == shape.world(), "DeviceMesh: ", shape.str(), " = ", shape.world(),
            " ranks, but the world has ", world_->size());
  const int r = world_->rank(), tp = int(shape.tp), shard = int(shape.dp_shard);
  tp_rank_ = r % tp;
  shard_rank_ = (r / tp) % shard;
  replicate_rank_ = r / (tp * shard);
  // Each split: ranks with equal colour form a group, ordered by key.
  dp_ = world_->split(tp_rank_, r, "dp");
  dp_shard_ = world_->split(replicate_rank_ * tp + tp_rank_, r, "dp_shard");
  dp_replicate_ = world_->split(shard_rank_ * tp + tp_rank_, r, "dp_replicate");
  tp_ = world_->split(replicate_rank_ * shard + shard_rank_, r, "tp");
}

void DeviceMesh::connect(Device device) {
  // In one order on every rank: a group's ranks all reach its init before any of them moves on.
  for (ProcessGroup* g : {world_.get(), dp_.get(), dp_shard_.get(), dp_replicate_.get(), tp_.get()})
    g->connect(device);
}

} // namespace vlm::parallel
