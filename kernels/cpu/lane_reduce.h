// Row reductions in a fixed order that the compiler vectorizes. A plain `for (j) s += f(j)` is one
// chain of dependent adds (the compiler may not reorder float adds), which caps a row reduction at
// one add per 3-4 cycles; 16 running sums (lane j % 16) combined pairwise at the end run at load
// speed and still give the same bits for any thread count. Likewise for max (std::max's NaN
// rule is not associative either, so the compiler keeps that loop scalar too).
#pragma once

#include <algorithm>
#include <cstdint>

namespace vlm::kernels::cpu {

template <typename A, typename F> A lane_sum(int64_t n, F f) {
  constexpr int64_t kLanes = 16;
  A lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; l++) lanes[l] += f(j + l);
  // The tail in its own sum: indexing `lanes` by a variable would keep the sums in memory.
  A tail = 0;
  for (; j < n; j++) tail += f(j);
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; l++) lanes[l] += lanes[l + width];
  return lanes[0] + tail;
}

// max(init, f(0), ..., f(n - 1)) (a NaN among them may or may not win, as with std::max).
template <typename A, typename F> A lane_max(int64_t n, F f, A init) {
  constexpr int64_t kLanes = 16;
  A lanes[kLanes];
  for (auto& l : lanes) l = init;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; l++) lanes[l] = std::max(lanes[l], f(j + l));
  A tail = init;
  for (; j < n; j++) tail = std::max(tail, f(j));
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; l++) lanes[l] = std::max(lanes[l], lanes[l + width]);
  return std::max(lanes[0], tail);
}

} // namespace vlm::kernels::cpu
