#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/rope_row.h"

namespace vlm::kernels::cpu {

namespace {

// Applies the rotation (c, s) to every (j, j + R/2) pair of every head, or its inverse when
// `inverse`; dims >= R are copied.
template <typename T>
void rotate(T* out, const T* in, const T* cos, const T* sin, const RopeShape& sh, bool inverse) {
  const int64_t half = sh.rotary_dim / 2, D = sh.head_dim;
#pragma omp parallel for if (sh.tokens * sh.heads * D > 65536)
  for (int64_t t = 0; t < sh.tokens; t++) {
    const T* c_row = cos + t * half;
    const T* s_row = sin + t * half;
    for (int64_t h = 0; h < sh.heads; h++) {
      const T* x = in + (t * sh.heads + h) * D;
      T* y = out + (t * sh.heads + h) * D;
      rope_row::rotate_row(y, x, c_row, s_row, half, D, inverse);
    }
  }
}

} // namespace

template <typename T>
void rope_cos_sin(T* cos, T* sin, const int64_t* positions, int64_t tokens, int64_t rotary_dim,
                  double theta) {
  using A = acc_t<T>;
  const int64_t half = rotary_dim / 2;
  // HF: inv_freq = 1 / theta ** (arange(0, R, 2).float() / R), all fp32 (f64 here for double).
  std::vector<A> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++)
    inv_freq[size_t(i)] = A(1) / std::pow(A(theta), A(2 * i) / A(rotary_dim));
#pragma omp parallel for if (tokens * half > 65536)
  for (int64_t t = 0; t < tokens; t++) {
    A pos = A(positions[t]); // HF: position_ids.float()
    for (int64_t i = 0; i < half; i++) {
      A angle = pos * inv_freq[size_t(i)];
      cos[t * half + i] = from_acc<T>(std::cos(angle));
      sin[t * half + i] = from_acc<T>(std::sin(angle));
    }
  }
}

template <typename T>
void rope_fwd(T* out, const T* x, const T* cos, const T* sin, const RopeShape& shape) {
  rotate(out, x, cos, sin, shape, /*inverse=*/false);
}

template <typename T>
void rope_bwd(T* dx, const T* dy, const T* cos, const T* sin, const RopeShape& shape) {
  rotate(dx, dy, cos, sin, shape, /*inverse=*/true);
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void rope_cos_sin<T>(T*, T*, const int64_t*, int64_t, int64_t, double);                 \
  template void rope_fwd<T>(T*, const T*, const T*, const T*, const RopeShape&);                   \
  template void rope_bwd<T>(T*, const T*, const T*, const T*, const RopeShape&);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
VLM_INSTANTIATE(bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
