// The collectives of tensor parallelism as differentiable ops (Megatron's "mappings"). Every rank
// of the tensor-parallel group runs the same forward on the same data (replicated activations)
// and backpropagates its own copy of the same loss, so:
//   * copy_to_tp enters the parallel region (the input of column-parallel projections): the
//     forward is the identity; in backward each rank holds only its heads' part of the input's
//     gradient, so the parts are summed over the group;
//   * reduce_from_tp leaves it (the output of row-parallel projections, each rank's partial sum):
//     the forward sums over the group; the backward is the identity (every rank's gradient of the
//     sum is the same).
// Both are collectives: every rank of the group must call them in the same order, which holds
// because the ranks run the same graph (activation checkpointing recomputes them in the same order
// too).
#pragma once

#include "parallel/process_group.h"
#include "src/core/tensor.h"

namespace vlm::parallel {

// Forward identity, backward all-reduce (sum) over `tp`.
Tensor copy_to_tp(const Tensor& x, ProcessGroup& tp);
// Forward all-reduce (sum) over `tp` into a new tensor, backward identity.
Tensor reduce_from_tp(const Tensor& x, ProcessGroup& tp);

} // namespace vlm::parallel
