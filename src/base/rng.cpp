#include "src/base/rng.h"

#include <cmath>
#include <cstring>

#include "src/base/check.h"

namespace vlm {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
} // namespace

Rng::Rng(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull);
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next_u64() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double Rng::normal() {
  if (has_cached_) {
    has_cached_ = false;
    return cached_normal_;
  }
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  double r = std::sqrt(-2.0 * std::log(u1));
  cached_normal_ = r * std::sin(2.0 * M_PI * u2);
  has_cached_ = true;
  return r * std::cos(2.0 * M_PI * u2);
}

int64_t Rng::randint(int64_t lo, int64_t hi) {
  VLM_CHECK(hi > lo, "randint: empty range [", lo, ", ", hi, ")");
  return lo + int64_t(next_u64() % uint64_t(hi - lo));
}

std::array<uint64_t, 5> Rng::state() const {
  uint64_t c;
  std::memcpy(&c, &cached_normal_, 8);
  // The cached normal is only meaningful when has_cached_; fold the flag into the top slot.
  return {s_[0], s_[1], s_[2], s_[3], has_cached_ ? c : ~0ull};
}

void Rng::set_state(const std::array<uint64_t, 5>& s) {
  for (int i = 0; i < 4; i++) s_[i] = s[i];
  has_cached_ = s[4] != ~0ull;
  if (has_cached_) std::memcpy(&cached_normal_, &s[4], 8);
}

} // namespace vlm
