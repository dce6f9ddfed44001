// Collectives over a group of ranks on tensors (DESIGN.md §6). Every rank of the group calls the
// same collectives in the same order with tensors of the same shape and dtype.
//
// Backends, chosen per call by the tensors' device:
//   * CPU tensors go over MPI (so CI runs every parallel path under `mpirun`);
//   * CUDA tensors go over NCCL, on the group's communication stream: the collective is ordered
//     after the work queued so far on the tensors' current stream (an event), and Work::wait()
//     makes the current stream wait for it (an event again); the host never blocks. The NCCL
//     communicator, bootstrapped over MPI, is made by connect() at start (DeviceMesh::connect:
//     the trainer and the benchmarks, every group of the mesh), or else at the group's first
//     CUDA collective.
//
// Every collective is watched (parallel/comm/watchdog.h): one that has not finished after
// collective_timeout seconds — a peer crashed, hangs, or skipped it — ends the process with an
// error naming the collective, so the launcher ends the job instead of letting it hang.
//
// Reductions: sum and max for f32, f64, i32, i64 and bf16 (bf16 partial sums are computed in f32
// and rounded to bf16, on MPI as in NCCL); avg for the floating types.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/core/tensor.h"

namespace vlm::parallel {

enum class ReduceOp { sum, avg, max };

// A collective started by one of the *_async calls. wait() returns when its output may be used:
// on CPU the data is there; on CUDA, work queued on the current stream from now on sees it. The
// tensors of the collective are kept alive until then. wait() twice is a no-op; a Work destroyed
// without wait() waits.
class Work {
public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class ProcessGroup {
public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "world", "dp_shard", ... and the ranks' world numbers, for messages.
  virtual std::string name() const = 0;

  // In place on every rank: t = op over the ranks' t.
  virtual std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  // out [size * n, ...] = the ranks' in [n, ...] stacked along dim 0 in rank order (any dtype).
  virtual std::unique_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) = 0;
  // out [n, ...] = block `rank` of op over the ranks' in [size * n, ...].
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                                     ReduceOp op = ReduceOp::sum) = 0;

  // The same, finished before they return (CPU) or ordered on the current stream (CUDA).
  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_gather(const Tensor& out, const Tensor& in) = 0;
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) = 0;
  // t = root's t on every rank (any dtype).
  virtual void broadcast(const Tensor& t, int root) = 0;
  // Root gets every rank's `in` — a contiguous host tensor, any length, one dtype on every rank —
  // flat and concatenated in rank order, and each rank's element count in `counts` (if given);
  // the other ranks get an undefined tensor and `counts` as it was. Host tensors only: what gathers
  // to one rank (an HF snapshot's writer) does so in host memory. Here by all_gather (every rank
  // receives every input, padded to the longest); the MPI group gathers to the root alone
  // (MPI_Gatherv).
  virtual Tensor gather(const Tensor& in, int root, std::vector<int64_t>* counts = nullptr);
  virtual void barrier() = 0;

  // Host values, summed (or maxed) over the group: step losses, token counts, norms.
  double all_reduce_value(double v, ReduceOp op = ReduceOp::sum);
  int64_t all_reduce_value(int64_t v, ReduceOp op = ReduceOp::sum);
  // Every rank's string, in rank order (checkpoints: each data-parallel rank's loader state).
  std::vector<std::string> all_gather_strings(const std::string& mine);

  // Makes what collectives on `device` need now, not inside the first one: on CUDA, the group's
  // NCCL communicator (every rank of the group calls it), watched like a collective — a peer that
  // never arrives ends the job with the same error naming the rank and the group. A no-op on the
  // CPU, for a group of one rank, and when already made. Throws naming the group when the build
  // has no NCCL.
  virtual void connect(Device device) { (void)device; }

  // The sub-group of the ranks that pass the same color, ordered by key (every rank calls it);
  // `name` labels it in messages.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key,
                                              const std::string& name = "") const = 0;
};

// All ranks of the job (MPI_COMM_WORLD; MPI is initialized on first use, parallel/comm/mpi_env.h);
// in a process without a launcher, a world of one without MPI (a LocalProcessGroup of one rank).
std::unique_ptr<ProcessGroup> world_group();

} // namespace vlm::parallel
