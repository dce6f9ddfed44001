// Timing two sides of a comparison under MPI (bench_collectives, bench_checkpoint): runs of a and
// b alternate, every rank starts each run together, a run's time is the slowest rank's, and the
// median over `iters` runs after `warmup` runs of each side is reported (upper_median).
#pragma once

#include "parallel/mpi.h"

#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "bench/median.h"

namespace vlm::bench {

// Median seconds of a and of b.
inline std::pair<double, double> time_pair(const std::function<void()>& a,
                                           const std::function<void()>& b, int iters, int warmup) {
  std::vector<double> ta, tb;
  for (int i = 0; i < iters + warmup; i++) {
    for (int side = 0; side < 2; side++) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      (side == 0 ? a : b)();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); // the slowest rank
      if (i >= warmup) (side == 0 ? ta : tb).push_back(s);
    }
  }
  return {upper_median(ta), upper_median(tb)};
}

} // namespace vlm::bench
