// Collectives over a group of ranks on tensors (DESIGN.md §6). Every rank of the group calls the
// same collectives in the same order with tensors of the same shape and dtype. This backend is
// MPI for CPU tensors (CI runs every parallel path under `mpirun`); CUDA tensors will go through
// NCCL on a communication stream (not built yet: they are refused with a clear error).
#pragma once

#include <memory>

#include "src/core/tensor.h"

namespace vlm::parallel {

enum class ReduceOp { sum, avg, max };

class ProcessGroup {
public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place on every rank: t = op over the ranks' t (f32, f64, i32, i64; avg: floats only).
  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  // out [size * n, ...] = the ranks' in [n, ...] stacked along dim 0 in rank order (any dtype).
  virtual void all_gather(const Tensor& out, const Tensor& in) = 0;
  // out [n, ...] = block `rank` of op over the ranks' in [size * n, ...] (as all_reduce's dtypes).
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) = 0;
  // t = root's t on every rank (any dtype).
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // The sub-group of the ranks that pass the same color, ordered by key (every rank calls it).
  virtual std::unique_ptr<ProcessGroup> split(int color, int key) const = 0;
};

// All ranks of the job (MPI_COMM_WORLD; MPI is initialized on first use, parallel/mpi_env.h).
std::unique_ptr<ProcessGroup> world_group();

} // namespace vlm::parallel
