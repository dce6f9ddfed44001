// The collectives of tensor parallelism as differentiable ops (Megatron's "mappings"). Every rank
// of the tensor-parallel group runs the same forward on the same data (replicated activations)
// and backpropagates its own copy of the same loss, so:
//   * copy_to_tp enters the parallel region (the input of column-parallel projections): the
//     forward is the identity; in backward each rank holds only its heads' part of the input's
//     gradient, so the parts are summed over the group;
//   * reduce_from_tp leaves it (the output of row-parallel projections, each rank's partial sum):
//     the forward sums over the group; the backward is the identity (every rank's gradient of the
//     sum is the same).
// Sequence parallelism (Megatron's SP) splits the rows (tokens) of the activations between the
// parallel regions over the group instead of replicating them: rank r holds rows
// [r·b, (r+1)·b) of T, b = ceil(T / tp), the last block padded with zero rows (zero rows stay
// zero through norms, residual adds and the MLP, and are dropped on the way out):
//   * split_rows enters the split region from replicated rows (forward: the rank's block;
//     backward: the blocks' gradients all-gathered, since every rank's replicated producer needs
//     the whole gradient), gather_rows leaves it for a replicated consumer (forward: all-gather;
//     backward: the rank's block of the — replicated, hence whole — gradient);
//   * gather_rows_to_tp replaces copy_to_tp under SP (forward: all-gather; backward: each rank's
//     partial input gradient summed and scattered: reduce-scatter), and reduce_scatter_rows
//     replaces reduce_from_tp (forward: reduce-scatter of the partial sums; backward: all-gather).
// All are collectives: every rank of the group must call them in the same order, which holds
// because the ranks run the same graph (activation checkpointing recomputes them in the same order
// too).
#pragma once

#include "parallel/comm/process_group.h"
#include "src/core/tensor.h"

namespace vlm::parallel {

// Forward identity, backward all-reduce (sum) over `tp`.
Tensor copy_to_tp(const Tensor& x, ProcessGroup& tp);
// Forward all-reduce (sum) over `tp` into a new tensor, backward identity.
Tensor reduce_from_tp(const Tensor& x, ProcessGroup& tp);

// Rows per rank under sequence parallelism: ceil(rows / tp).
int64_t rows_per_rank(int64_t rows, const ProcessGroup& tp);
// x [T, ...] replicated -> this rank's block [rows_per_rank(T), ...] (zero rows past T).
Tensor split_rows(const Tensor& x, ProcessGroup& tp);
// The blocks [b, ...] -> the first `rows` of them stacked [rows, ...], replicated; backward: the
// rank's block of the gradient.
Tensor gather_rows(const Tensor& x, int64_t rows, ProcessGroup& tp);
// The same forward; backward: the partial gradients [rows, ...] summed over `tp`, each rank
// keeping its block (reduce-scatter).
Tensor gather_rows_to_tp(const Tensor& x, int64_t rows, ProcessGroup& tp);
// Partial sums x [T, ...] -> this rank's block of their sum [rows_per_rank(T), ...]; backward:
// the blocks' gradients all-gathered (the first T rows).
Tensor reduce_scatter_rows(const Tensor& x, ProcessGroup& tp);

} // namespace vlm::parallel
