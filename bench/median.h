// Medians of timings: `median` is the middle value, or of an even count the mean of the two middle
// ones (the training-step benchmarks); `upper_median` is the higher of those two (v[n / 2] of the
// sorted values: the MPI benchmarks, bench/mpi_timing.h and bench_fsdp_step). `wall_seconds`: the
// wall times of a few runs of a function after one warm-up run (the CPU op benchmarks).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
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

// Seconds of each of `reps` runs of fn (steady clock), after one untimed warm-up run.
inline std::vector<double> wall_seconds(int64_t reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int64_t i = 0; i < reps; i++) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  return t;
}

} // namespace vlm::bench
