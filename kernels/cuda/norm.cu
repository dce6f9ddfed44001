// RMSNorm (plain, zero-centred, gated), LayerNorm, the fused residual add + RMSNorm (declared in
// kernels/norm.h) and the fused q/k RMSNorm + RoPE (declared in kernels/rope.h) on the GPU.
//
// Row kernels: a row is handled by WPR warps (1 for dim <= 1024, 4 up to 4096, else 8) and a
// 256-thread block holds 256 / (32 * WPR) rows; blocks loop over row groups (grid-stride), so any
// number of rows works with a bounded grid. Loads are 16-byte packs when every pointer of the call
// is 16-byte aligned and dim is a multiple of the pack size, scalar otherwise. Statistics and all
// arithmetic in fp32; per-row sums by a fixed shuffle tree (deterministic).
//
// Parameter gradients: kernel 1 gives each (column, row chunk) one thread that sums its chunk's
// rows in order into an fp32 partial; kernel 2 sums the partials of a column in chunk order. The
// chunking depends on (rows, dim) only, so results are bit-identical run to run; no atomics.
#include "kernels/norm.h"
#include "kernels/rope.h"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/load_store.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace ldst;

constexpr int kNormThreads = 256;

// Sum over the 32 * WPR threads of a row (threadIdx.x), rows along threadIdx.y. Every thread of
// the block must call it (it may synchronize the block).
template <int WPR> __device__ __forceinline__ float row_sum(float v, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (WPR == 1) {
    return v;
  } else {
    float* s = smem + threadIdx.y * WPR;
    __syncthreads(); // the previous call's readers are done
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0;
#pragma unroll
    for (int i = 0; i < WPR; i++) t += s[i];
    return t;
  }
}

__device__ __forceinline__ float sigmoidf(float v) { return 1.f / (1.f + expf(-v)); }

__device__ __forceinline__ float gain(const float* wv, RmsNormWeight mode, int k) {
  return mode == RmsNormWeight::none ? 1.f : mode == RmsNormWeight::scale ? wv[k] : 1.f + wv[k];
}

// This thread's row in the current row group of a row kernel (see VLM_ROW_LOOP). A padding row
// of the last group (valid false) visits no columns but must still take part in row_sum.
struct RowSlot {
  int64_t r;   // the row
  bool valid;  // r < rows
  int64_t n;   // the columns this thread's row visits: dim, or 0 for a padding row
  int64_t off; // the row's first element (row 0's for a padding row, which reads nothing)
  __device__ __forceinline__ RowSlot(int64_t base, int64_t rows, int64_t dim)
      : r(base + threadIdx.y), valid(r < rows), n(valid ? dim : 0), off((valid ? r : 0) * dim) {}
};

// The row loop shared by every row kernel: blocks stride over groups of blockDim.y rows, so any
// number of rows works with a bounded grid; `base` is the group's first row.
#define VLM_ROW_LOOP(rows)                                                                         \
  for (int64_t base = int64_t(blockIdx.x) * blockDim.y; base < (rows);                             \
       base += int64_t(gridDim.x) * blockDim.y)

// The column loop of a row kernel (templated on WPR and V): c is the first column of each V-wide
// pack of this thread among a row's n columns (the row's 32 * WPR threads take consecutive packs).
#define VLM_PACK_LOOP(c, n)                                                                        \
  for (int64_t c = int64_t(threadIdx.x) * V; c < (n); c += int64_t(32 * WPR * V))

// 1 / rms(x) of the row at xr (every thread of the row gets it), also stored to rstd[row.r] once.
// Shared by the plain and the gated RMSNorm forward so both compute it the same way.
template <typename T, int WPR, int V>
__device__ __forceinline__ float rms_rstd(const T* xr, const RowSlot& row, int64_t dim, float eps,
                                          float* rstd, float* smem) {
  float ss = 0;
  VLM_PACK_LOOP(c, row.n) {
    float v[V];
    load_vec<T, V>(xr, c, v);
#pragma unroll
    for (int k = 0; k < V; k++) ss += v[k] * v[k];
  }
  ss = row_sum<WPR>(ss, smem);
  const float rs = 1.f / sqrtf(ss / float(dim) + eps);
  if (row.valid && threadIdx.x == 0) rstd[row.r] = rs;
  return rs;
}

template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    rms_fwd_kernel(T* y, float* rstd, const T* x, const T* w, RmsNormWeight mode, int64_t rows,
                   int64_t dim, float eps) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const T* xr = x + row.off;
    const float rs = rms_rstd<T, WPR, V>(xr, row, dim, eps, rstd, smem);
    T* yr = y + row.off;
    VLM_PACK_LOOP(c, row.n) {
      float v[V], wv[V], o[V];
      load_vec<T, V>(xr, c, v);
      if (mode != RmsNormWeight::none) load_vec<T, V>(w, c, wv);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xhat = v[k] * rs;
        o[k] = mode == RmsNormWeight::none    ? xhat
               : mode == RmsNormWeight::scale ? wv[k] * round_to<T>(xhat)
                                              : (1.f + wv[k]) * xhat;
      }
      store_vec<T, V>(yr, c, o);
    }
  }
}

// What both passes of the RMSNorm and LayerNorm backward read at column c: the packs of the rows
// xr and dyr, and w's when has_w.
template <typename T, int V>
__device__ __forceinline__ void load_bwd_packs(float (&xv)[V], float (&gv)[V], float (&wv)[V],
                                               const T* xr, const T* dyr, const T* w, bool has_w,
                                               int64_t c) {
  load_vec<T, V>(xr, c, xv);
  load_vec<T, V>(dyr, c, gv);
  if (has_w) load_vec<T, V>(w, c, wv);
}

template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    rms_bwd_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd,
                   RmsNormWeight mode, int64_t rows, int64_t dim, const T* dres) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const T* xr = x + row.off;
    const T* dyr = dy + row.off;
    const float rs = row.valid ? rstd[row.r] : 0.f;
    float dot = 0;
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], gv[V], wv[V];
      load_bwd_packs<T, V>(xv, gv, wv, xr, dyr, w, mode != RmsNormWeight::none, c);
#pragma unroll
      for (int k = 0; k < V; k++) dot += gv[k] * gain(wv, mode, k) * xv[k] * rs;
    }
    dot = row_sum<WPR>(dot, smem);
    const float cc = dot / float(dim);
    T* dxr = dx + row.off;
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], gv[V], wv[V], o[V];
      load_bwd_packs<T, V>(xv, gv, wv, xr, dyr, w, mode != RmsNormWeight::none, c);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float a = gv[k] * gain(wv, mode, k);
        o[k] = rs * (a - xv[k] * rs * cc);
      }
      if (dres) { // add_rms_norm: + the sum's own gradient, to the T-rounded norm gradient
        float rv[V];
        load_vec<T, V>(dres + row.off, c, rv);
#pragma unroll
        for (int k = 0; k < V; k++) o[k] = __fadd_rn(round_to<T>(o[k]), rv[k]);
      }
      store_vec<T, V>(dxr, c, o);
    }
  }
}

// add_rms_norm: s = T(x + h) stored, then the RMSNorm of s as rms_fwd_kernel computes it (s is
// recomputed from x and h in the second pass rather than read back).
template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    add_rms_fwd_kernel(T* s, T* y, float* rstd, const T* x, const T* h, const T* w,
                       RmsNormWeight mode, int64_t rows, int64_t dim, float eps) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const int64_t off = row.off;
    float ss = 0;
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], hv[V], sv[V];
      load_vec<T, V>(x + off, c, xv);
      load_vec<T, V>(h + off, c, hv);
#pragma unroll
      for (int k = 0; k < V; k++) {
        sv[k] = round_to<T>(__fadd_rn(xv[k], hv[k]));
        ss += sv[k] * sv[k];
      }
      store_vec<T, V>(s + off, c, sv);
    }
    ss = row_sum<WPR>(ss, smem);
    const float rs = 1.f / sqrtf(ss / float(dim) + eps);
    if (row.valid && threadIdx.x == 0) rstd[row.r] = rs;
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], hv[V], wv[V], o[V];
      load_vec<T, V>(x + off, c, xv);
      load_vec<T, V>(h + off, c, hv);
      if (mode != RmsNormWeight::none) load_vec<T, V>(w, c, wv);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xhat = round_to<T>(__fadd_rn(xv[k], hv[k])) * rs;
        o[k] = mode == RmsNormWeight::none    ? xhat
               : mode == RmsNormWeight::scale ? wv[k] * round_to<T>(xhat)
                                              : (1.f + wv[k]) * xhat;
      }
      store_vec<T, V>(y + off, c, o);
    }
  }
}

// --- fused q/k RMSNorm + RoPE: one warp per (token, head) row ------------------------------------

struct RopeRows {
  int64_t rows, heads, dim, half, rotary;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The normed value at column j of the row xr (rms_fwd_kernel's formula), rounded to T.
template <typename T>
__device__ __forceinline__ float normed_at(const T* xr, const T* w, RmsNormWeight mode, float rs,
                                           int64_t j) {
  const float xhat = ld(xr + j) * rs;
  const float o = mode == RmsNormWeight::none    ? xhat
                  : mode == RmsNormWeight::scale ? ld(w + j) * round_to<T>(xhat)
                                                 : (1.f + ld(w + j)) * xhat;
  return round_to<T>(o);
}

// The pair (j, j + half) rotated (rope_fwd) or rotated back (rope_bwd), each output rounded to T:
// rope.cu's rotate_kernel formula, __f*_rn so that no FMA contraction changes it.
template <typename T, bool kInverse>
__device__ __forceinline__ void rotate_pair(float x1, float x2, float c, float s, float& y1,
                                            float& y2) {
  const float x1c = round_to<T>(__fmul_rn(x1, c)), x2c = round_to<T>(__fmul_rn(x2, c));
  const float x1s = round_to<T>(__fmul_rn(x1, s)), x2s = round_to<T>(__fmul_rn(x2, s));
  if (!kInverse) {
    y1 = round_to<T>(__fsub_rn(x1c, x2s));
    y2 = round_to<T>(__fadd_rn(x2c, x1s));
  } else {
    y1 = round_to<T>(__fadd_rn(x1c, x2s));
    y2 = round_to<T>(__fsub_rn(x2c, x1s));
  }
}

// The warp loop of the rope-norm kernels: blockDim (32, kNormThreads / 32), warp threadIdx.y of the
// block takes row r; the condition is uniform over a warp, so warp shuffles are safe inside.
#define VLM_WARP_ROW_LOOP(r, rows)                                                                 \
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < (rows);                     \
       r += int64_t(gridDim.x) * blockDim.y)

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    rms_rope_fwd_kernel(T* y, float* rstd, const T* x, const T* w, RmsNormWeight mode, const T* cos,
                        const T* sin, RopeRows sh, float eps) {
  const int lane = int(threadIdx.x);
  VLM_WARP_ROW_LOOP(r, sh.rows) {
    const T* xr = x + r * sh.dim;
    T* yr = y + r * sh.dim;
    float ss = 0;
    for (int64_t j = lane; j < sh.dim; j += 32) {
      const float v = ld(xr + j);
      ss += v * v;
    }
    ss = warp_sum(ss);
    const float rs = 1.f / sqrtf(ss / float(sh.dim) + eps);
    if (lane == 0) rstd[r] = rs;
    const int64_t t = r / sh.heads;
    for (int64_t j = lane; j < sh.half; j += 32) {
      const float c = ld(cos + t * sh.half + j), s = ld(sin + t * sh.half + j);
      float y1, y2;
      rotate_pair<T, false>(normed_at(xr, w, mode, rs, j), normed_at(xr, w, mode, rs, j + sh.half),
                            c, s, y1, y2);
      st(yr + j, y1);
      st(yr + j + sh.half, y2);
    }
    for (int64_t d = sh.rotary + lane; d < sh.dim; d += 32)
      st(yr + d, normed_at(xr, w, mode, rs, d));
  }
}

// dn at the pair (j, j + half) of the row dyr: the gradient rope_bwd hands the norm, T-rounded.
template <typename T>
__device__ __forceinline__ void rope_grad_pair(const T* dyr, const T* cos, const T* sin,
                                               const RopeRows& sh, int64_t t, int64_t j, float& dn1,
                                               float& dn2) {
  const float c = ld(cos + t * sh.half + j), s = ld(sin + t * sh.half + j);
  rotate_pair<T, true>(ld(dyr + j), ld(dyr + j + sh.half), c, s, dn1, dn2);
}

__device__ __forceinline__ float gain_at(const float w, RmsNormWeight mode) {
  return mode == RmsNormWeight::none ? 1.f : mode == RmsNormWeight::scale ? w : 1.f + w;
}

template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    rms_rope_bwd_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd,
                        RmsNormWeight mode, const T* cos, const T* sin, RopeRows sh) {
  const int lane = int(threadIdx.x);
  const bool has_w = mode != RmsNormWeight::none;
  VLM_WARP_ROW_LOOP(r, sh.rows) {
    const T* xr = x + r * sh.dim;
    const T* dyr = dy + r * sh.dim;
    T* dxr = dx + r * sh.dim;
    const float rs = rstd[r];
    const int64_t t = r / sh.heads;
    auto g = [&](int64_t j) { return gain_at(has_w ? ld(w + j) : 0.f, mode); };
    float dot = 0;
    for (int64_t j = lane; j < sh.half; j += 32) {
      float dn1, dn2;
      rope_grad_pair(dyr, cos, sin, sh, t, j, dn1, dn2);
      dot += dn1 * g(j) * ld(xr + j) * rs;
      dot += dn2 * g(j + sh.half) * ld(xr + j + sh.half) * rs;
    }
    for (int64_t d = sh.rotary + lane; d < sh.dim; d += 32)
      dot += ld(dyr + d) * g(d) * ld(xr + d) * rs;
    const float cc = warp_sum(dot) / float(sh.dim);
    for (int64_t j = lane; j < sh.half; j += 32) {
      float dn1, dn2;
      rope_grad_pair(dyr, cos, sin, sh, t, j, dn1, dn2);
      const int64_t j2 = j + sh.half;
      st(dxr + j, rs * (dn1 * g(j) - ld(xr + j) * rs * cc));
      st(dxr + j2, rs * (dn2 * g(j2) - ld(xr + j2) * rs * cc));
    }
    for (int64_t d = sh.rotary + lane; d < sh.dim; d += 32)
      st(dxr + d, rs * (ld(dyr + d) * g(d) - ld(xr + d) * rs * cc));
  }
}

#undef VLM_WARP_ROW_LOOP

template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    gated_fwd_kernel(T* y, float* rstd, const T* x, const T* z, const T* w, int64_t rows,
                     int64_t dim, float eps) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const int64_t off = row.off;
    const float rs = rms_rstd<T, WPR, V>(x + off, row, dim, eps, rstd, smem);
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], zv[V], wv[V], o[V];
      load_vec<T, V>(x + off, c, xv);
      load_vec<T, V>(z + off, c, zv);
      if (w) load_vec<T, V>(w, c, wv);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xr = round_to<T>(xv[k] * rs);
        const float nn = w ? round_to<T>(wv[k] * xr) : xr;
        o[k] = nn * zv[k] * sigmoidf(zv[k]);
      }
      store_vec<T, V>(y + off, c, o);
    }
  }
}

// What both passes of the gated backward read at column c of the row at `off`: the packs of x,
// z, dy and (when given) w.
template <typename T, int V>
__device__ __forceinline__ void load_gated_packs(float (&xv)[V], float (&zv)[V], float (&gv)[V],
                                                 float (&wv)[V], const T* x, const T* z,
                                                 const T* dy, const T* w, int64_t off, int64_t c) {
  load_vec<T, V>(x + off, c, xv);
  load_vec<T, V>(z + off, c, zv);
  load_vec<T, V>(dy + off, c, gv);
  if (w) load_vec<T, V>(w, c, wv);
}

template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    gated_bwd_kernel(T* dx, T* dz, const T* dy, const T* x, const T* z, const T* w,
                     const float* rstd, int64_t rows, int64_t dim) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const int64_t off = row.off;
    const float rs = row.valid ? rstd[row.r] : 0.f;
    float dot = 0;
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], zv[V], gv[V], wv[V], o[V];
      load_gated_packs<T, V>(xv, zv, gv, wv, x, z, dy, w, off, c);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xhat = xv[k] * rs, sig = sigmoidf(zv[k]);
        const float dn = gv[k] * zv[k] * sig;
        dot += dn * (w ? wv[k] : 1.f) * xhat;
        if (dz) {
          const float dsilu = sig * (1.f + zv[k] * (1.f - sig));
          const float xr = round_to<T>(xhat);
          const float nn = w ? round_to<T>(wv[k] * xr) : xr;
          o[k] = gv[k] * nn * dsilu;
        }
      }
      if (dz) store_vec<T, V>(dz + off, c, o);
    }
    dot = row_sum<WPR>(dot, smem);
    if (!dx) continue; // uniform over the launch
    const float cc = dot / float(dim);
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], zv[V], gv[V], wv[V], o[V];
      load_gated_packs<T, V>(xv, zv, gv, wv, x, z, dy, w, off, c);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float a = gv[k] * zv[k] * sigmoidf(zv[k]) * (w ? wv[k] : 1.f);
        o[k] = rs * (a - xv[k] * rs * cc);
      }
      store_vec<T, V>(dx + off, c, o);
    }
  }
}

template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    ln_fwd_kernel(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t rows,
                  int64_t dim, float eps) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const int64_t off = row.off;
    float s = 0;
    VLM_PACK_LOOP(c, row.n) {
      float v[V];
      load_vec<T, V>(x + off, c, v);
#pragma unroll
      for (int k = 0; k < V; k++) s += v[k];
    }
    const float mu = row_sum<WPR>(s, smem) / float(dim);
    float ss = 0; // two passes: the variance of centred values does not cancel
    VLM_PACK_LOOP(c, row.n) {
      float v[V];
      load_vec<T, V>(x + off, c, v);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float d = v[k] - mu;
        ss += d * d;
      }
    }
    ss = row_sum<WPR>(ss, smem);
    const float rs = 1.f / sqrtf(ss / float(dim) + eps);
    if (row.valid && threadIdx.x == 0) {
      mean[row.r] = mu;
      rstd[row.r] = rs;
    }
    VLM_PACK_LOOP(c, row.n) {
      float v[V], wv[V], bv[V], o[V];
      load_vec<T, V>(x + off, c, v);
      if (w) load_vec<T, V>(w, c, wv);
      if (b) load_vec<T, V>(b, c, bv);
#pragma unroll
      for (int k = 0; k < V; k++) {
        float t = (v[k] - mu) * rs;
        if (w) t *= wv[k];
        if (b) t += bv[k];
        o[k] = t;
      }
      store_vec<T, V>(y + off, c, o);
    }
  }
}

template <typename T, int WPR, int V>
__global__ void __launch_bounds__(kNormThreads)
    ln_bwd_kernel(T* dx, const T* dy, const T* x, const T* w, const float* mean, const float* rstd,
                  int64_t rows, int64_t dim) {
  __shared__ float smem[kNormThreads / 32];
  VLM_ROW_LOOP(rows) {
    const RowSlot row(base, rows, dim);
    const int64_t off = row.off;
    const float mu = row.valid ? mean[row.r] : 0.f, rs = row.valid ? rstd[row.r] : 0.f;
    float sum_a = 0, dot = 0;
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], gv[V], wv[V];
      load_bwd_packs<T, V>(xv, gv, wv, x + off, dy + off, w, w != nullptr, c);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xhat = (xv[k] - mu) * rs, a = w ? gv[k] * wv[k] : gv[k];
        sum_a += a;
        dot += a * xhat;
      }
    }
    sum_a = row_sum<WPR>(sum_a, smem);
    dot = row_sum<WPR>(dot, smem);
    const float mean_a = sum_a / float(dim), mean_ax = dot / float(dim);
    VLM_PACK_LOOP(c, row.n) {
      float xv[V], gv[V], wv[V], o[V];
      load_bwd_packs<T, V>(xv, gv, wv, x + off, dy + off, w, w != nullptr, c);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float xhat = (xv[k] - mu) * rs, a = w ? gv[k] * wv[k] : gv[k];
        o[k] = rs * (a - mean_a - xhat * mean_ax);
      }
      store_vec<T, V>(dx + off, c, o);
    }
  }
}

#undef VLM_PACK_LOOP
#undef VLM_ROW_LOOP

// --- parameter gradients ------------------------------------------------------------------------

enum class ParamKind { rms, gated, layer, rms_rope };

// What ParamKind::rms_rope needs to rotate dy back (unused by the other kinds).
template <typename T> struct RopeGradArgs {
  const T* cos = nullptr;
  const T* sin = nullptr;
  RopeRows sh{};
};

constexpr int kColThreads = 256;

// partial_w[c * dim + j] (=) and partial_b likewise: sums over the rows of chunk c, in row order.
template <typename T, ParamKind K>
__global__ void __launch_bounds__(kColThreads)
    param_partials_kernel(float* partial_w, float* partial_b, const T* dy, const T* x, const T* z,
                          const float* mean, const float* rstd, int64_t rows, int64_t dim,
                          int64_t chunk, RopeGradArgs<T> rope) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t c = blockIdx.y;
  const int64_t begin = c * chunk, end = begin + chunk < rows ? begin + chunk : rows;
  float sw = 0, sb = 0;
  for (int64_t r = begin; r < end; r++) {
    const int64_t i = r * dim + j;
    const float g = ld(dy + i), rs = rstd[r];
    if constexpr (K == ParamKind::rms) {
      sw += g * ld(x + i) * rs;
    } else if constexpr (K == ParamKind::rms_rope) {
      float dn = g; // dims >= rotary pass through
      if (j < rope.sh.rotary) {
        const int64_t jj = j < rope.sh.half ? j : j - rope.sh.half;
        float dn1, dn2;
        rope_grad_pair(dy + r * dim, rope.cos, rope.sin, rope.sh, r / rope.sh.heads, jj, dn1, dn2);
        dn = j < rope.sh.half ? dn1 : dn2;
      }
      sw += dn * ld(x + i) * rs;
    } else if constexpr (K == ParamKind::gated) {
      const float zj = ld(z + i);
      sw += g * zj * sigmoidf(zj) * (ld(x + i) * rs);
    } else {
      sw += g * ((ld(x + i) - mean[r]) * rs);
      sb += g;
    }
  }
  if (partial_w) partial_w[c * dim + j] = sw;
  if (partial_b) partial_b[c * dim + j] = sb;
}

template <typename T>
__global__ void __launch_bounds__(kColThreads)
    param_finish_kernel(T* out, const float* partial, int64_t chunks, int64_t dim) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  float s = 0;
  for (int64_t c = 0; c < chunks; c++) s += partial[c * dim + j];
  st(out + j, s);
}

// dw (and db) from the rows; any of them may be null. rows == 0 gives zeros.
template <ParamKind K, typename T>
void param_grads(T* dw, T* db, const T* dy, const T* x, const T* z, const float* mean,
                 const float* rstd, int64_t rows, int64_t dim, cudaStream_t stream, const char* op,
                 RopeGradArgs<cuda_t<T>> rope = {}) {
  if (!dw && !db) return;
  if (rows == 0) {
    if (dw) VLM_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(dim) * sizeof(T), stream));
    if (db) VLM_CUDA_CHECK(cudaMemsetAsync(db, 0, size_t(dim) * sizeof(T), stream));
    return;
  }
  const int64_t col_blocks = (dim + kColThreads - 1) / kColThreads;
  int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(1024, 2048 / col_blocks));
  chunks = std::min(chunks, (rows + 15) / 16); // at least ~16 rows per chunk
  chunks = std::max<int64_t>(chunks, 1);
  const int64_t chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + chunk - 1) / chunk;
  const size_t part_bytes = size_t(chunks * dim) * sizeof(float);
  float* pw = dw ? static_cast<float*>(malloc_async(part_bytes, stream)) : nullptr;
  float* pb = db ? static_cast<float*>(malloc_async(part_bytes, stream)) : nullptr;
  const dim3 grid{unsigned(col_blocks), unsigned(chunks), 1u};
  param_partials_kernel<cuda_t<T>, K><<<grid, kColThreads, 0, stream>>>(
      pw, pb, dptr(dy), dptr(x), dptr(z), mean, rstd, rows, dim, chunk, rope);
  check_last_launch(op);
  if (dw) {
    param_finish_kernel<<<unsigned(col_blocks), kColThreads, 0, stream>>>(dptr(dw), pw, chunks,
                                                                          dim);
    check_last_launch(op);
  }
  if (db) {
    param_finish_kernel<<<unsigned(col_blocks), kColThreads, 0, stream>>>(dptr(db), pb, chunks,
                                                                          dim);
    check_last_launch(op);
  }
  free_async(pw, stream);
  free_async(pb, stream);
}

// The vector width for a call: 16-byte packs when dim is a multiple of the pack and every pointer
// of the call (null ones aside) is 16-byte aligned, scalar otherwise.
template <typename T> int vec_width(int64_t dim, std::initializer_list<const void*> ptrs) {
  constexpr int V = int(16 / sizeof(T));
  if (dim % V != 0) return 1;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return 1;
  return V;
}

RopeRows rope_rows(const RopeShape& s) {
  VLM_CHECK(s.rotary_dim >= 2 && s.rotary_dim % 2 == 0 && s.rotary_dim <= s.head_dim,
            "rms_norm_rope (cuda): rotary_dim ", s.rotary_dim,
            " must be even, >= 2 and <= head_dim ", s.head_dim);
  return RopeRows{s.tokens * s.heads, s.heads, s.head_dim, s.rotary_dim / 2, s.rotary_dim};
}

int warps_per_row(int64_t dim) { return dim <= 1024 ? 1 : dim <= 4096 ? 4 : 8; }

// The one launcher of the row kernels: the row layout of `dim` (WPR warps a row, 256 / (32 * WPR)
// rows a block, a bounded grid), the vector width V from `ptrs`, then
// pick(std::integral_constant<int, WPR>, std::integral_constant<int, V>) -- which returns the
// kernel<T, WPR, V> instantiation -- launched with `args` and checked under the name `op`.
template <typename T, typename Pick, typename... Args>
void launch_rows(const char* op, int64_t rows, int64_t dim, std::initializer_list<const void*> ptrs,
                 void* stream, Pick pick, Args... args) {
  const int vec = vec_width<T>(dim, ptrs);
  const int wpr = warps_per_row(dim);
  const int rows_per_block = kNormThreads / (32 * wpr);
  const dim3 block(unsigned(32 * wpr), unsigned(rows_per_block));
  const unsigned grid = grid_blocks(rows, rows_per_block);
  constexpr int VV = int(16 / sizeof(T));
  auto with_wpr = [&](auto w) {
    if (vec == VV) {
      auto kernel = pick(w, std::integral_constant<int, VV>{});
      kernel<<<grid, block, 0, as_stream(stream)>>>(args...);
    } else {
      auto kernel = pick(w, std::integral_constant<int, 1>{});
      kernel<<<grid, block, 0, as_stream(stream)>>>(args...);
    }
  };
  if (wpr == 1)
    with_wpr(std::integral_constant<int, 1>{});
  else if (wpr == 4)
    with_wpr(std::integral_constant<int, 4>{});
  else
    with_wpr(std::integral_constant<int, 8>{});
  check_last_launch(op);
}

// The kernel<cuda_t<T>, WPR, V> picker for launch_rows.
#define VLM_ROW_KERNEL(kernel)                                                                     \
  [](auto wpr, auto v) { return kernel<cuda_t<T>, decltype(wpr)::value, decltype(v)::value>; }

} // namespace

template <typename T>
void rms_norm_fwd(T* y, float* rstd, const T* x, const T* w, RmsNormWeight mode, int64_t rows,
                  int64_t dim, double eps, void* stream) {
  if (rows == 0) return;
  launch_rows<T>("rms_norm_fwd", rows, dim, {y, x, mode == RmsNormWeight::none ? nullptr : w},
                 stream, VLM_ROW_KERNEL(rms_fwd_kernel), dptr(y), rstd, dptr(x), dptr(w), mode,
                 rows, dim, float(eps));
}

template <typename T>
void rms_norm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const float* rstd,
                  RmsNormWeight mode, int64_t rows, int64_t dim, void* stream) {
  if (dx && rows > 0)
    launch_rows<T>("rms_norm_bwd", rows, dim,
                   {dx, dy, x, mode == RmsNormWeight::none ? nullptr : w}, stream,
                   VLM_ROW_KERNEL(rms_bwd_kernel), dptr(dx), dptr(dy), dptr(x), dptr(w), rstd, mode,
                   rows, dim, static_cast<const cuda_t<T>*>(nullptr));
  param_grads<ParamKind::rms, T>(dw, nullptr, dy, x, nullptr, nullptr, rstd, rows, dim,
                                 as_stream(stream), "rms_norm_bwd (dw)");
}

template <typename T>
void add_rms_norm_fwd(T* s, T* y, float* rstd, const T* x, const T* h, const T* w,
                      RmsNormWeight mode, int64_t rows, int64_t dim, double eps, void* stream) {
  if (rows == 0) return;
  launch_rows<T>("add_rms_norm_fwd", rows, dim,
                 {s, y, x, h, mode == RmsNormWeight::none ? nullptr : w}, stream,
                 VLM_ROW_KERNEL(add_rms_fwd_kernel), dptr(s), dptr(y), rstd, dptr(x), dptr(h),
                 dptr(w), mode, rows, dim, float(eps));
}

template <typename T>
void add_rms_norm_bwd(T* ds, T* dw, const T* ds_in, const T* dy, const T* s, const T* w,
                      const float* rstd, RmsNormWeight mode, int64_t rows, int64_t dim,
                      void* stream) {
  if (ds && rows > 0)
    launch_rows<T>("add_rms_norm_bwd", rows, dim,
                   {ds, dy, s, ds_in, mode == RmsNormWeight::none ? nullptr : w}, stream,
                   VLM_ROW_KERNEL(rms_bwd_kernel), dptr(ds), dptr(dy), dptr(s), dptr(w), rstd, mode,
                   rows, dim, dptr(ds_in));
  param_grads<ParamKind::rms, T>(dw, nullptr, dy, s, nullptr, nullptr, rstd, rows, dim,
                                 as_stream(stream), "add_rms_norm_bwd (dw)");
}

template <typename T>
void rms_norm_rope_fwd(T* y, float* rstd, const T* x, const T* w, RmsNormWeight mode, const T* cos,
                       const T* sin, const RopeShape& shape, double eps, void* stream) {
  const RopeRows sh = rope_rows(shape);
  if (sh.rows == 0) return;
  const dim3 block(32u, unsigned(kNormThreads / 32));
  rms_rope_fwd_kernel<cuda_t<T>>
      <<<grid_blocks(sh.rows, kNormThreads / 32), block, 0, as_stream(stream)>>>(
          dptr(y), rstd, dptr(x), dptr(w), mode, dptr(cos), dptr(sin), sh, float(eps));
  check_last_launch("rms_norm_rope_fwd");
}

template <typename T>
void rms_norm_rope_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const float* rstd,
                       RmsNormWeight mode, const T* cos, const T* sin, const RopeShape& shape,
                       void* stream) {
  const RopeRows sh = rope_rows(shape);
  if (dx && sh.rows > 0) {
    const dim3 block(32u, unsigned(kNormThreads / 32));
    rms_rope_bwd_kernel<cuda_t<T>>
        <<<grid_blocks(sh.rows, kNormThreads / 32), block, 0, as_stream(stream)>>>(
            dptr(dx), dptr(dy), dptr(x), dptr(w), rstd, mode, dptr(cos), dptr(sin), sh);
    check_last_launch("rms_norm_rope_bwd");
  }
  RopeGradArgs<cuda_t<T>> rope;
  rope.cos = dptr(cos);
  rope.sin = dptr(sin);
  rope.sh = sh;
  param_grads<ParamKind::rms_rope, T>(dw, nullptr, dy, x, nullptr, nullptr, rstd, sh.rows, sh.dim,
                                      as_stream(stream), "rms_norm_rope_bwd (dw)", rope);
}

template <typename T>
void rms_norm_gated_fwd(T* y, float* rstd, const T* x, const T* z, const T* w, int64_t rows,
                        int64_t dim, double eps, void* stream) {
  if (rows == 0) return;
  launch_rows<T>("rms_norm_gated_fwd", rows, dim, {y, x, z, w}, stream,
                 VLM_ROW_KERNEL(gated_fwd_kernel), dptr(y), rstd, dptr(x), dptr(z), dptr(w), rows,
                 dim, float(eps));
}

template <typename T>
void rms_norm_gated_bwd(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w,
                        const float* rstd, int64_t rows, int64_t dim, void* stream) {
  if ((dx || dz) && rows > 0)
    launch_rows<T>("rms_norm_gated_bwd", rows, dim, {dx, dz, dy, x, z, w}, stream,
                   VLM_ROW_KERNEL(gated_bwd_kernel), dptr(dx), dptr(dz), dptr(dy), dptr(x), dptr(z),
                   dptr(w), rstd, rows, dim);
  param_grads<ParamKind::gated, T>(dw, nullptr, dy, x, z, nullptr, rstd, rows, dim,
                                   as_stream(stream), "rms_norm_gated_bwd (dw)");
}

template <typename T>
void layer_norm_fwd(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b,
                    int64_t rows, int64_t dim, double eps, void* stream) {
  if (rows == 0) return;
  launch_rows<T>("layer_norm_fwd", rows, dim, {y, x, w, b}, stream, VLM_ROW_KERNEL(ln_fwd_kernel),
                 dptr(y), mean, rstd, dptr(x), dptr(w), dptr(b), rows, dim, float(eps));
}

template <typename T>
void layer_norm_bwd(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const float* mean,
                    const float* rstd, int64_t rows, int64_t dim, void* stream) {
  if (dx && rows > 0)
    launch_rows<T>("layer_norm_bwd", rows, dim, {dx, dy, x, w}, stream,
                   VLM_ROW_KERNEL(ln_bwd_kernel), dptr(dx), dptr(dy), dptr(x), dptr(w), mean, rstd,
                   rows, dim);
  param_grads<ParamKind::layer, T>(dw, db, dy, x, nullptr, mean, rstd, rows, dim, as_stream(stream),
                                   "layer_norm_bwd (dw, db)");
}

#undef VLM_ROW_KERNEL

#define VLM_INSTANTIATE(T)                                                                         \
  template void rms_norm_fwd<T>(T*, float*, const T*, const T*, RmsNormWeight, int64_t, int64_t,   \
                                double, void*);                                                    \
  template void rms_norm_bwd<T>(T*, T*, const T*, const T*, const T*, const float*, RmsNormWeight, \
                                int64_t, int64_t, void*);                                          \
  template void rms_norm_gated_fwd<T>(T*, float*, const T*, const T*, const T*, int64_t, int64_t,  \
                                      double, void*);                                              \
  template void rms_norm_gated_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const float*, int64_t, int64_t, void*);                      \
  template void layer_norm_fwd<T>(T*, float*, float*, const T*, const T*, const T*, int64_t,       \
                                  int64_t, double, void*);                                         \
  template void layer_norm_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const float*,          \
                                  const float*, int64_t, int64_t, void*);                          \
  template void add_rms_norm_fwd<T>(T*, T*, float*, const T*, const T*, const T*, RmsNormWeight,   \
                                    int64_t, int64_t, double, void*);                              \
  template void add_rms_norm_bwd<T>(T*, T*, const T*, const T*, const T*, const T*, const float*,  \
                                    RmsNormWeight, int64_t, int64_t, void*);                       \
  template void rms_norm_rope_fwd<T>(T*, float*, const T*, const T*, RmsNormWeight, const T*,      \
                                     const T*, const RopeShape&, double, void*);                   \
  template void rms_norm_rope_bwd<T>(T*, T*, const T*, const T*, const T*, const float*,           \
                                     RmsNormWeight, const T*, const T*, const RopeShape&, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
