// The one composition point of parallelism (DESIGN.md §2.2, §6): parallelize() applies, to a model
// that is only described (DESIGN.md §2.1: the trainer) or already built and loaded on the host
// (`dump`, the benchmarks, tests),
//   1. tensor parallelism (parallel/tp/tensor_parallel.h) by the family's plan: first, since AC and
//      FSDP wrap whatever the projections have become — split weights, their collectives as
//      Module wrappers — and FSDP then shards each rank's split parameters over its dp_shard
//      peers (the same tensor-parallel rank in every data-parallel replica),
//   2. activation checkpointing on the blocks (parallel/ac/activation_checkpointing.h), so that a
//      recomputation re-runs the block's TP collectives too,
//   3. FSDP / HSDP / DDP over the data-parallel groups (parallel/fsdp/fsdp.h), last, so its gather
//      wrapper sits outside the checkpoint's and a block is whole while it is recomputed,
// then allocates (or moves) whatever FSDP did not shard on the device. A described model comes out
// allocated in its local parts only — TP sets their shapes, FSDP allocates its flat shards — and
// zero: fill it by param_layouts() (nn::Module::initialize with init_parts, or
// model::load_hf_weights with the layouts), so no rank ever holds it whole. This is torchtitan's
// order. Every place
// that trains a model (the trainer, `dump`, the benchmarks, the data-parallel tests) goes through
// here, so the order cannot drift between them and a new kind of parallelism is added once.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "parallel/ac/activation_checkpointing.h"
#include "parallel/comm/mesh.h"
#include "parallel/fsdp/fsdp.h"
#include "parallel/param_layout.h"
#include "parallel/tp/tensor_parallel.h"
#include "src/core/ops/loss.h"
#include "src/nn/module.h"

namespace vlm::parallel {

struct ParallelizeOptions {
  AcMode ac = AcMode::off;
  FsdpOptions fsdp;    // used when there is a shard group
  TpPlan tp_plan = {}; // used when there is a tensor-parallel group of more than one rank
  bool sequence_parallel = false; // with tensor parallelism: the plan's sequence region by rows
};

// The groups a model is made parallel over: a mesh's, or stand-ins (the benchmarks' recording
// and compute-only groups, the tests' LocalProcessGroup). All null: one process, no FSDP.
struct ParallelGroups {
  ProcessGroup* shard = nullptr;     // FSDP shards over it (size 1 included); null: no FSDP
  ProcessGroup* replicate = nullptr; // replicas of the shards (HSDP, DDP); null or size 1: none
  ProcessGroup* dp = nullptr;        // every data-parallel rank: the step sums losses over it
  ProcessGroup* tp = nullptr;        // tensor parallelism over it; null or size 1: none
  // The mesh's dp_shard, dp_replicate, dp and tp groups, FSDP even on one rank.
  static ParallelGroups of(const DeviceMesh& mesh);
};

// What parallelize() applied; undoes it when destroyed (FSDP's wrappers, the AC wrappers, then
// TP's; parameters stay sharded and split), so it must go before the model. Empty when
// default-constructed.
class Parallelized {
public:
  Parallelized() = default;
  ~Parallelized();
  Parallelized(Parallelized&& other) noexcept;
  Parallelized& operator=(Parallelized&& other) noexcept;
  Parallelized(const Parallelized&) = delete;
  Parallelized& operator=(const Parallelized&) = delete;

  // The sharded model; null without FSDP.
  Fsdp* fsdp() const { return fsdp_.get(); }
  // The split model; null without tensor parallelism.
  TensorParallel* tensor_parallel() const { return tp_.get(); }
  // Where this rank's part of every parameter that is not whole sits (checkpoints).
  std::map<std::string, ParamLayout> param_layouts() const {
    return parallel::param_layouts(fsdp_.get(), tp_.get());
  }
  // The whole model on every rank, as plain tensors (HF snapshots, export, generation), and back
  // (collective: every rank calls both; no-ops for one process).
  void unshard_all() const;
  void reshard_all() const;
  // The data-parallel group; null for one process.
  ProcessGroup* dp_group() const { return dp_; }

  // --- The step protocol: everything the training step asks of the parallelism
  // (src/train/train_step.cpp names none of it). Nothing applied (one process, none()): each
  // call does nothing, or the plain local thing.
  // An empty Parallelized, for steppers of a model that is not parallel.
  static const Parallelized& none();
  // Around each micro-batch's forward and backward (FSDP's gathers and reductions). `first`: the
  // step's first (gradients start from zero); `last`: its last (they are reduced to their final
  // values, over replicas too).
  void begin_micro_step(bool first, bool last) const;
  void end_micro_step() const;
  // After the step's last micro-step: partial gradients summed where the placement says so
  // (replicated weights applied to a rank's heads or rows, heads shared by TP ranks).
  void finish_gradients(const nn::Module& root) const;
  // The trainable tensors grouped by their weight in the gradient norm: a tensor held whole by k
  // ranks of the tensor-parallel group counts 1/k. Made once (the stepper's constructor), not
  // every step.
  struct NormGroups {
    std::vector<std::pair<double, std::vector<Tensor>>> groups; // weight, tensors
  };
  NormGroups norm_groups(const std::vector<Tensor>& trainable) const;
  // This rank's weighted squared gradient norm (element 0 of the result; on the device).
  // sum_grad_norm_sq then sums it over the ranks that hold different parts (FSDP's shard group,
  // the tensor-parallel group), in place.
  Tensor local_grad_norm_sq(const NormGroups& groups) const;
  void sum_grad_norm_sq(const Tensor& norm_sq) const;
  // Over every data-parallel rank: the step's targets and losses (sums), its skip flag (max).
  int64_t sum_over_dp(int64_t v) const;
  double sum_over_dp(double v) const;
  void max_over_dp(const Tensor& t) const;
  // The loss's combine hook (src/core/ops/loss.h): the head's vocabulary split over the
  // tensor-parallel group, its all-reduces as the combine functions; null for a whole head.
  const VocabSplit* loss_split() const;

private:
  friend Parallelized parallelize(nn::Module&, const std::vector<nn::Module*>&,
                                  const ParallelGroups&, const ParallelizeOptions&, Device);
  void undo();

  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<Fsdp> fsdp_;
  std::vector<std::pair<nn::Module*, size_t>> ac_wrappers_; // block, wrapper handle
  ProcessGroup* dp_ = nullptr;
};

// Parallelizes `root` (materialized, the same values on every rank, frozen parameters already
// frozen) whose repeated units are `blocks` (descendants of root in forward order: a CausalLM's
// blocks()), over `groups`, and places it on `device`.
[[nodiscard]] Parallelized parallelize(nn::Module& root, const std::vector<nn::Module*>& blocks,
                                       const ParallelGroups& groups,
                                       const ParallelizeOptions& options, Device device);
// Over a mesh: tensor parallelism over its tp group when tp > 1 (options.tp_plan: the family's,
// model::tp_plan), then FSDP over its dp_shard group (with dp_replicate's replicas) when it has
// more than one data-parallel rank; a single data-parallel rank keeps its parameters whole.
[[nodiscard]] Parallelized parallelize(nn::Module& root, const std::vector<nn::Module*>& blocks,
                                       const DeviceMesh& mesh, const ParallelizeOptions& options,
                                       Device device);

} // namespace vlm::parallel
