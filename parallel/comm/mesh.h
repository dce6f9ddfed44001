// The device mesh (DESIGN.md §6): world = dp_replicate × dp_shard × tp, tp innermost (the ranks
// of one tensor-parallel group are neighbours, i.e. inside a node), then dp_shard, then
// dp_replicate:
//
//   world rank = (replicate_rank × dp_shard + shard_rank) × tp + tp_rank
//
// dp_shard ranks shard parameters, gradients and optimizer state (FSDP); dp_replicate groups hold
// replicas of those shards and all-reduce their gradients (HSDP; DDP when dp_shard = 1). The
// data-parallel rank (which share of the data a rank reads) is replicate_rank × dp_shard +
// shard_rank; tensor-parallel peers read the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm/process_group.h"

namespace vlm::parallel {

struct MeshShape {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1;
  int64_t dp() const { return dp_replicate * dp_shard; }
  int64_t world() const { return dp() * tp; }
  std::string str() const; // "dp_replicate 2 x dp_shard 2 x tp 1"
};

// The layout for `world` ranks from the [parallel] settings; 0 = "the ranks that are left".
// `sharded` (data_parallel = fsdp): dp_shard defaults to every data-parallel rank; otherwise
// (ddp) dp_shard must be 1 and dp_replicate takes them all. An impossible layout is an error
// naming the numbers that disagree.
MeshShape resolve_mesh_shape(int64_t world, int64_t dp_replicate, int64_t dp_shard, int64_t tp,
                             bool sharded);

class DeviceMesh {
public:
  // Splits `world` into the mesh's groups (collective: every rank of `world` calls it).
  DeviceMesh(std::unique_ptr<ProcessGroup> world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  int replicate_rank() const { return replicate_rank_; }
  int shard_rank() const { return shard_rank_; }
  int tp_rank() const { return tp_rank_; }
  int dp_rank() const { return int(replicate_rank_ * shape_.dp_shard + shard_rank_); }

  ProcessGroup& world() const { return *world_; }
  // Every data-parallel rank of this rank's tensor-parallel slice (losses, token counts).
  ProcessGroup& dp() const { return *dp_; }
  ProcessGroup& dp_shard() const { return *dp_shard_; }
  ProcessGroup& dp_replicate() const { return *dp_replicate_; }
  ProcessGroup& tp() const { return *tp_; }

  // Every group's communicator for `device`, made now (ProcessGroup::connect; collective: every
  // rank of the world calls it), so that no collective of a step makes one.
  void connect(Device device);

private:
  MeshShape shape_;
  int replicate_rank_ = 0, shard_rank_ = 0, tp_rank_ = 0;
  std::unique_ptr<ProcessGroup> world_, dp_, dp_shard_, dp_replicate_, tp_;
};

} // namespace vlm::parallel
