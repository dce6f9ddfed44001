#include "kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/lane_reduce.h"

namespace vlm::kernels::cpu {

namespace {

// Below this many elements the loops run single-threaded (thread start-up would dominate).
constexpr int64_t kParallelMin = 32768;
// Parameter-gradient sums use at most this many row blocks; the split depends only on `rows`.
constexpr int64_t kMaxRowBlocks = 128;

// v rounded to T and widened again: models a T-valued intermediate (identity for float/double).
template <typename T> acc_t<T> round_to(acc_t<T> v) { return to_acc<acc_t<T>>(from_acc<T>(v)); }

template <typename A, typename T> A load(const T* p, int64_t j) { return to_acc<A>(p[j]); }

// 1/sqrt(mean(x^2) + eps) over one row.
template <typename T> acc_t<T> rms_rstd(const T* xr, int64_t dim, double eps) {
  using A = acc_t<T>;
  const A sum_sq = lane_sum<A>(dim, [&](int64_t j) {
    const A v = load<A>(xr, j);
    return v * v;
  });
  return A(1) / std::sqrt(sum_sq / A(dim) + A(eps));
}

template <typename A> A sigmoid(A v) { return A(1) / (A(1) + std::exp(-v)); }

// The gated norm's pre-gate value n = w ⊙ x̂ with HF's T-roundings (x̂, then the product).
template <typename T> acc_t<T> gated_pre(acc_t<T> xhat, const T* w, int64_t j) {
  using A = acc_t<T>;
  A xr = round_to<T>(xhat);
  return w ? round_to<T>(load<A>(w, j) * xr) : xr;
}

// Runs row_fn(r, partial) for every row, OpenMP over fixed row blocks, where `partial` is the
// block's zeroed buffer of `width` sums (null when width is 0). Returns the block partials
// added in block order (width values), so the totals do not depend on the thread count.
template <typename A, typename RowFn>
std::vector<A> rows_with_block_sums(int64_t rows, int64_t dim, int64_t width, RowFn row_fn) {
  if (rows == 0) return std::vector<A>(size_t(width), A(0));
  int64_t block = (rows + kMaxRowBlocks - 1) / kMaxRowBlocks;
  int64_t n_blocks = (rows + block - 1) / block;
  std::vector<A> partial(size_t(n_blocks * width), A(0));
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t b = 0; b < n_blocks; b++) {
    A* acc = width ? partial.data() + b * width : nullptr;
    int64_t end = std::min(rows, (b + 1) * block);
    for (int64_t r = b * block; r < end; r++) row_fn(r, acc);
  }
  std::vector<A> total(size_t(width), A(0));
  for (int64_t b = 0; b < n_blocks; b++)
    for (int64_t j = 0; j < width; j++) total[j] += partial[b * width + j];
  return total;
}

} // namespace

template <typename T>
void rms_norm_fwd(T* y, acc_t<T>* rstd, const T* x, const T* w, RmsNormWeight mode, int64_t rows,
                  int64_t dim, double eps) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; r++) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    A rs = rms_rstd(xr, dim, eps);
    rstd[r] = rs;
    switch (mode) { // one loop per mode: a switch inside would keep the loop scalar
    case RmsNormWeight::none:
      for (int64_t j = 0; j < dim; j++) yr[j] = from_acc<T>(load<A>(xr, j) * rs);
      break;
    case RmsNormWeight::scale:
      for (int64_t j = 0; j < dim; j++)
        yr[j] = from_acc<T>(load<A>(w, j) * round_to<T>(load<A>(xr, j) * rs));
      break;
    case RmsNormWeight::offset:
      for (int64_t j = 0; j < dim; j++)
        yr[j] = from_acc<T>((A(1) + load<A>(w, j)) * (load<A>(xr, j) * rs));
      break;
    }
  }
}

template <typename T>
void rms_norm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const acc_t<T>* rstd,
                  RmsNormWeight mode, int64_t rows, int64_t dim) {
  using A = acc_t<T>;
  // dx = rstd * (a - x̂ * mean(a ⊙ x̂)) with a = dy ⊙ gain; dw = Σ_rows dy ⊙ x̂.
  // gain[j] = w[j] + offset (scale: offset 0; offset: 1), or 1 without a weight (mode none),
  // converted once: no branch on the mode and no conversion inside the row loops.
  std::vector<A> gain(size_t(dim), A(1));
  if (w)
    for (int64_t j = 0; j < dim; j++)
      gain[j] = load<A>(w, j) + (mode == RmsNormWeight::offset ? A(1) : A(0));
  auto row_fn = [&](int64_t r, A* dw_acc) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const A* g = gain.data();
    const A rs = rstd[r];
    if (dw_acc)
      for (int64_t j = 0; j < dim; j++) dw_acc[j] += load<A>(dyr, j) * load<A>(xr, j) * rs;
    if (!dx) return;
    const A c =
        rs * lane_sum<A>(dim, [&](int64_t j) { return load<A>(dyr, j) * g[j] * load<A>(xr, j); }) /
        A(dim);
    T* dxr = dx + r * dim;
    for (int64_t j = 0; j < dim; j++)
      dxr[j] = from_acc<T>(rs * (load<A>(dyr, j) * g[j] - load<A>(xr, j) * rs * c));
  };
  auto dw_sum = rows_with_block_sums<A>(rows, dim, dw ? dim : 0, row_fn);
  if (dw)
    for (int64_t j = 0; j < dim; j++) dw[j] = from_acc<T>(dw_sum[j]);
}

template <typename T>
void rms_norm_gated_fwd(T* y, acc_t<T>* rstd, const T* x, const T* z, const T* w, int64_t rows,
                        int64_t dim, double eps) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; r++) {
    const T* xr = x + r * dim;
    const T* zr = z + r * dim;
    T* yr = y + r * dim;
    A rs = rms_rstd(xr, dim, eps);
    rstd[r] = rs;
    for (int64_t j = 0; j < dim; j++) {
      A n = gated_pre<T>(load<A>(xr, j) * rs, w, j);
      A zj = load<A>(zr, j);
      yr[j] = from_acc<T>(n * zj * sigmoid(zj));
    }
  }
}

template <typename T>
void rms_norm_gated_bwd(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w,
                        const acc_t<T>* rstd, int64_t rows, int64_t dim) {
  using A = acc_t<T>;
  // dn = dy * silu(z); dz = dy * n * silu'(z); dw = Σ_rows dn ⊙ x̂; dx as rms_norm with a = dn ⊙ w.
  auto row_fn = [&](int64_t r, A* dw_acc) {
    const T* xr = x + r * dim;
    const T* zr = z + r * dim;
    const T* dyr = dy + r * dim;
    A rs = rstd[r];
    A dot = 0;
    for (int64_t j = 0; j < dim; j++) {
      A xhat = load<A>(xr, j) * rs, zj = load<A>(zr, j), sig = sigmoid(zj);
      A dn = load<A>(dyr, j) * zj * sig;
      if (dw_acc) dw_acc[j] += dn * xhat;
      dot += dn * (w ? load<A>(w, j) : A(1)) * xhat;
      if (dz) {
        A dsilu = sig * (A(1) + zj * (A(1) - sig));
        dz[r * dim + j] = from_acc<T>(load<A>(dyr, j) * gated_pre<T>(xhat, w, j) * dsilu);
      }
    }
    if (!dx) return;
    A c = dot / A(dim);
    for (int64_t j = 0; j < dim; j++) {
      A zj = load<A>(zr, j);
      A a = load<A>(dyr, j) * zj * sigmoid(zj) * (w ? load<A>(w, j) : A(1));
      dx[r * dim + j] = from_acc<T>(rs * (a - load<A>(xr, j) * rs * c));
    }
  };
  auto dw_sum = rows_with_block_sums<A>(rows, dim, dw ? dim : 0, row_fn);
  if (dw)
    for (int64_t j = 0; j < dim; j++) dw[j] = from_acc<T>(dw_sum[j]);
}

template <typename T>
void layer_norm_fwd(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* w, const T* b,
                    int64_t rows, int64_t dim, double eps) {
  using A = acc_t<T>;
#pragma omp parallel for if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; r++) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    A mu = lane_sum<A>(dim, [&](int64_t j) { return load<A>(xr, j); }) / A(dim);
    // two passes: the variance of centred values does not cancel
    const A sum_sq = lane_sum<A>(dim, [&](int64_t j) {
      const A d = load<A>(xr, j) - mu;
      return d * d;
    });
    A rs = A(1) / std::sqrt(sum_sq / A(dim) + A(eps));
    mean[r] = mu;
    rstd[r] = rs;
    for (int64_t j = 0; j < dim; j++) {
      A v = (load<A>(xr, j) - mu) * rs;
      if (w) v *= load<A>(w, j);
      if (b) v += load<A>(b, j);
      yr[j] = from_acc<T>(v);
    }
  }
}

template <typename T>
void layer_norm_bwd(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const acc_t<T>* mean,
                    const acc_t<T>* rstd, int64_t rows, int64_t dim) {
  using A = acc_t<T>;
  // dx = rstd * (a - mean(a) - x̂ * mean(a ⊙ x̂)) with a = dy ⊙ w; dw = Σ dy ⊙ x̂; db = Σ dy.
  // Partial sums: dw in [0, dim), db in [db_at, db_at + dim).
  int64_t db_at = dw ? dim : 0;
  int64_t width = db_at + (db ? dim : 0);
  auto row_fn = [&](int64_t r, A* acc) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    A mu = mean[r], rs = rstd[r];
    A sum_a = 0, dot = 0;
    for (int64_t j = 0; j < dim; j++) {
      A g = load<A>(dyr, j), xhat = (load<A>(xr, j) - mu) * rs;
      if (dw) acc[j] += g * xhat;
      if (db) acc[db_at + j] += g;
      A a = w ? g * load<A>(w, j) : g;
      sum_a += a;
      dot += a * xhat;
    }
    if (!dx) return;
    A mean_a = sum_a / A(dim), mean_ax = dot / A(dim);
    for (int64_t j = 0; j < dim; j++) {
      A g = load<A>(dyr, j), xhat = (load<A>(xr, j) - mu) * rs;
      A a = w ? g * load<A>(w, j) : g;
      dx[r * dim + j] = from_acc<T>(rs * (a - mean_a - xhat * mean_ax));
    }
  };
  auto sums = rows_with_block_sums<A>(rows, dim, width, row_fn);
  for (int64_t j = 0; j < dim; j++) {
    if (dw) dw[j] = from_acc<T>(sums[j]);
    if (db) db[j] = from_acc<T>(sums[db_at + j]);
  }
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void rms_norm_fwd<T>(T*, acc_t<T>*, const T*, const T*, RmsNormWeight, int64_t,         \
                                int64_t, double);                                                  \
  template void rms_norm_bwd<T>(T*, T*, const T*, const T*, const T*, const acc_t<T>*,             \
                                RmsNormWeight, int64_t, int64_t);                                  \
  template void rms_norm_gated_fwd<T>(T*, acc_t<T>*, const T*, const T*, const T*, int64_t,        \
                                      int64_t, double);                                            \
  template void rms_norm_gated_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const acc_t<T>*, int64_t, int64_t);                          \
  template void layer_norm_fwd<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, int64_t, \
                                  int64_t, double);                                                \
  template void layer_norm_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const acc_t<T>*,       \
                                  const acc_t<T>*, int64_t, int64_t);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(double)
VLM_INSTANTIATE(bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cpu
