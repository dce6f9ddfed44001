#include "kernels/rope.h"

#include <cmath>
#include <vector>

namespace vlm::kernels::cpu {

namespace {

// Rounds an acc-type value to the storage type T and back: PyTorch rounds the result of every
// elementwise op on a T tensor, so this reproduces HF's bf16 arithmetic (identity for f32/f64).
template <typename T, typename A> inline A round_to(A v) { return to_acc<A>(from_acc<T>(v)); }

// Applies the rotation (c, s) to every (j, j + R/2) pair of every head, or its inverse when
// `inverse`; dims >= R are copied.
template <typename T>
void rotate(T* out, const T* in, const T* cos, const T* sin, const RopeShape& sh, bool inverse) {
  using A = acc_t<T>;
  const int64_t half = sh.rotary_dim / 2, D = sh.head_dim;
#pragma omp parallel for if (sh.tokens * sh.heads * D > 65536)
  for (int64_t t = 0; t < sh.tokens; t++) {
    const T* c_row = cos + t * half;
    const T* s_row = sin + t * half;
    for (int64_t h = 0; h < sh.heads; h++) {
      const T* x = in + (t * sh.heads + h) * D;
      T* y = out + (t * sh.heads + h) * D;
      for (int64_t j = 0; j < half; j++) {
        A c = to_acc<A>(c_row[j]), s = to_acc<A>(s_row[j]);
        A x1 = to_acc<A>(x[j]), x2 = to_acc<A>(x[j + half]);
        A x1c = round_to<T>(x1 * c), x2c = round_to<T>(x2 * c);
        A x1s = round_to<T>(x1 * s), x2s = round_to<T>(x2 * s);
        if (!inverse) {
          y[j] = from_acc<T>(x1c - x2s);
          y[j + half] = from_acc<T>(x2c + x1s);
        } else { // transpose of the rotation matrix
          y[j] = from_acc<T>(x1c + x2s);
          y[j + half] = from_acc<T>(x2c - x1s);
        }
      }
      for (int64_t d = sh.rotary_dim; d < D; d++) y[d] = x[d];
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
