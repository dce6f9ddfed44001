// Medians of timings: `median` is the middle value, or of an even count the mean of the two middle
// ones (the training-step benchmarks); `upper_median` is the higher of those two (v[n / 2] of the
// sorted values: the MPI benchmarks, bench/mpi_timing.h and bench_fsdp_step).
#pragma once

#include <algorithm>
#include <vector>

namespace vlm::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double upper_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace vlm::bench
