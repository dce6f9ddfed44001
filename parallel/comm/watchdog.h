// The collective watchdog: no rank waits forever for a peer that crashed, hangs or skipped a
// collective. A background thread looks at what is being waited for; one wait longer than the
// timeout prints "[rank r/W] error: <collective> on <group> did not finish within T s ..." and ends
// the process with exit code 1 (std::_Exit: MPI may only be called from the main thread). The
// launcher (mpirun; srun with --kill-on-bad-exit) then ends the job; peers still waiting end the
// same way when their own timeout passes.
//
// An error on the rank itself (an exception) is handled by main(): it prints the error and calls
// MPI_Abort, which ends every rank at once (parallel/comm/mpi_env.h, abort_job).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "src/base/dtype.h"

namespace vlm::parallel {

// Seconds a collective may take; 0 = unlimited. Default 600 (VLM_COLLECTIVE_TIMEOUT_S overrides
// the default; training sets parallel.collective_timeout_s).
void set_collective_timeout(double seconds);
double collective_timeout();

// While alive, the calling thread is blocked in collective `op` on `numel` elements of `dtype`
// in the group named `group` (which must outlive it): watched. Cheap (no allocation, no lock): the
// message is only formatted when the timeout passes. One blocked wait at a time is watched (MPI
// is called from the main thread only); a nested one is not.
class BlockedWait {
public:
  BlockedWait(const char* op, int64_t numel, DType dtype, const std::string& group);
  ~BlockedWait();
  BlockedWait(const BlockedWait&) = delete;
  BlockedWait& operator=(const BlockedWait&) = delete;

private:
  bool owner_ = false;
};

// Work in flight that the host does not block on (a CUDA collective on its stream): the thread
// polls `done` until it returns true, and `error` (may be empty) for an asynchronous failure
// (NCCL), which ends the process at once. Both must be thread-safe.
void watch_in_flight(std::string what, std::function<bool()> done,
                     std::function<std::string()> error = {});

} // namespace vlm::parallel
