// Seeded random numbers: a counter-free xoshiro256** generator seeded by splitmix64, so a
// (seed, stream) pair gives the same numbers on every platform and compiler.
#pragma once

#include <array>
#include <cstdint>

namespace vlm {

class Rng {
public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0);
  uint64_t next_u64();
  double uniform(); // [0, 1)
  double uniform(double lo, double hi);
  double normal(); // standard normal (Box-Muller, cached pair)
  double normal(double mean, double std) { return mean + std * normal(); }
  int64_t randint(int64_t lo, int64_t hi); // [lo, hi)

  // The full state, for checkpoints.
  std::array<uint64_t, 5> state() const;
  void set_state(const std::array<uint64_t, 5>& s);

private:
  uint64_t s_[4];
  double cached_normal_ = 0;
  bool has_cached_ = false;
};

} // namespace vlm
