// Sums over dims and the non-finite count on CUDA (declared in kernels/elementwise.h).
//
// Determinism: no float atomics. Each output's sum is split into a number of chunks that depends
// only on the shape; every chunk is reduced by one block in a fixed tree (per-thread strided
// sums, then warp butterflies, then warp 0), and a second pass adds a row of chunk partials in the
// same way. The same input therefore gives bitwise the same result on every run and device.
//
// Two kernels cover the layouts:
//  - row: the reduced elements of one output are close together (innermost reduced stride 1,
//    e.g. sum over the last dim): one block per (output, chunk), threads stride over the chunk.
//  - column: the outputs are contiguous and the reduced dims are outer (e.g. the bias gradient,
//    [tokens, hidden] -> [hidden]): 32 outputs per block in x, 8 threads in y stride over the
//    chunk, coalesced loads across x.
#include "kernels/elementwise.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda {
namespace {

using namespace dev;

using Ix = Indexer<kMaxDims>;

// The dims [first, last) of l without size-1 dims, contiguous neighbours merged.
Ix collapse_part(const StridedLayout& l, int first, int last) {
  Ix c;
  for (int d = first; d < last; d++) {
    if (l.shape[d] == 1) continue;
    int prev = c.ndim - 1;
    if (prev >= 0 && c.strides[prev] == l.strides[d] * l.shape[d]) {
      c.shape[prev] *= l.shape[d];
      c.strides[prev] = l.strides[d];
    } else {
      c.shape[c.ndim] = l.shape[d];
      c.strides[c.ndim] = l.strides[d];
      c.ndim++;
    }
  }
  return c;
}

Ix flat_ix(int64_t n, int64_t stride) {
  Ix c;
  c.ndim = 1;
  c.shape[0] = n;
  c.strides[0] = stride;
  return c;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// grid (outputs, chunks); out[o] when there is one chunk, else out[o * chunks + chunk].
template <typename In, typename Out>
__global__ void row_sum_kernel(Out* out, const In* in, Ix kept, Ix red, int64_t n_red,
                               int64_t chunk) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x;
  const int64_t base = kept.offset(o);
  const int64_t begin = int64_t(blockIdx.y) * chunk;
  const int64_t end = min(n_red, begin + chunk);
  float acc = 0.0f;
  for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x)
    acc += to_f32(in[base + red.offset(r)]);
  acc = block_reduce(acc, SumOp{}, scratch);
  if (threadIdx.x == 0) {
    if (gridDim.y == 1)
      out[o] = from_f32<Out>(acc);
    else
      out[o * gridDim.y + blockIdx.y] = from_f32<Out>(acc);
  }
}

constexpr int kColX = 32, kColY = 8;

// grid (ceil(n_out / 32), chunks), block (32, 8); out[o] or out[chunk * n_out + o].
template <typename In, typename Out>
__global__ void col_sum_kernel(Out* out, const In* in, Ix kept, Ix red, int64_t n_out,
                               int64_t n_red, int64_t chunk) {
  __shared__ float part[kColY][kColX + 1];
  const int64_t o = int64_t(blockIdx.x) * kColX + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * chunk;
  const int64_t end = min(n_red, begin + chunk);
  float acc = 0.0f;
  if (o < n_out) {
    const int64_t base = kept.offset(o);
    for (int64_t r = begin + threadIdx.y; r < end; r += kColY)
      acc += to_f32(in[base + red.offset(r)]);
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < n_out) {
    float s = part[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kColY; y++) s += part[y][threadIdx.x];
    if (gridDim.y == 1)
      out[o] = from_f32<Out>(s);
    else
      out[int64_t(blockIdx.y) * n_out + o] = from_f32<Out>(s);
  }
}

int row_threads(int64_t chunk) { return chunk <= 256 ? 32 : chunk <= 2048 ? 128 : 256; }

template <typename T>
void sum_launch(T* out, const T* in, const Ix& kept, const Ix& red, int64_t n_out, int64_t n_red,
                void* stream) {
  cudaStream_t s = as_stream(stream);
  VLM_CHECK(n_out < (int64_t(1) << 31) * kColX, "sum: ", n_out, " outputs are too many");
  const bool column = kept.ndim >= 1 && kept.strides[kept.ndim - 1] == 1 &&
                      (red.ndim == 0 || red.strides[red.ndim - 1] != 1);
  if (column) {
    int64_t bx = ceil_div(n_out, kColX);
    // Enough chunks for ~1024 blocks in all, each chunk at least 256 rows.
    int64_t chunks =
        std::clamp<int64_t>(std::min(ceil_div(n_red, 256), ceil_div(1024, bx)), 1, 65535);
    int64_t chunk = ceil_div(n_red, chunks);
    chunks = ceil_div(n_red, chunk);
    dim3 block(kColX, kColY);
    if (chunks == 1) {
      col_sum_kernel<T, T>
          <<<dim3(unsigned(bx), 1), block, 0, s>>>(out, in, kept, red, n_out, n_red, chunk);
      check_last_launch("sum");
      return;
    }
    auto* partial = static_cast<float*>(malloc_async(size_t(chunks * n_out) * 4, stream));
    col_sum_kernel<T, float><<<dim3(unsigned(bx), unsigned(chunks)), block, 0, s>>>(
        partial, in, kept, red, n_out, n_red, chunk);
    check_last_launch("sum");
    // partial is [chunks, n_out]: sum over the outer dim.
    col_sum_kernel<float, T><<<dim3(unsigned(bx), 1), block, 0, s>>>(
        out, partial, flat_ix(n_out, 1), flat_ix(chunks, n_out), n_out, chunks, chunks);
    check_last_launch("sum");
    free_async(partial, stream);
    return;
  }
  VLM_CHECK(n_out < (int64_t(1) << 31), "sum: ", n_out, " outputs are too many");
  int64_t chunks = 1;
  if (n_red > 8192 && n_out < 2048)
    chunks = std::min(ceil_div(n_red, 8192), std::max<int64_t>(1, 2048 / n_out));
  int64_t chunk = ceil_div(n_red, chunks);
  chunks = ceil_div(n_red, chunk);
  if (chunks == 1) {
    row_sum_kernel<T, T>
        <<<dim3(unsigned(n_out), 1), row_threads(chunk), 0, s>>>(out, in, kept, red, n_red, chunk);
    check_last_launch("sum");
    return;
  }
  auto* partial = static_cast<float*>(malloc_async(size_t(chunks * n_out) * 4, stream));
  row_sum_kernel<T, float><<<dim3(unsigned(n_out), unsigned(chunks)), row_threads(chunk), 0, s>>>(
      partial, in, kept, red, n_red, chunk);
  check_last_launch("sum");
  // partial is [n_out, chunks]: sum each row.
  row_sum_kernel<float, T><<<dim3(unsigned(n_out), 1), row_threads(chunks), 0, s>>>(
      out, partial, flat_ix(n_out, chunks), flat_ix(chunks, 1), chunks, chunks);
  check_last_launch("sum");
  free_async(partial, stream);
}

// --- non-finite count ----------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ bool finite_value(T v) {
  if constexpr (std::is_same_v<T, double>)
    return isfinite(v);
  else
    return isfinite(to_f32(v));
}

template <typename T>
__global__ void nonfinite_kernel(const T* x, int64_t n, unsigned long long* count) {
  __shared__ unsigned warp_counts[32];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned c = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    c += finite_value(x[i]) ? 0u : 1u;
  for (int m = 16; m > 0; m >>= 1) c += __shfl_xor_sync(0xffffffffu, c, m);
  if ((threadIdx.x & 31) == 0) warp_counts[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (unsigned w = 0; w < blockDim.x / 32; w++) total += warp_counts[w];
    // An integer atomic: exact whatever the order.
    if (total) atomicAdd(count, total);
  }
}

} // namespace

void sum_fwd(DType t, void* out, const void* in, const StridedLayout& l, int kept, void* stream) {
  VLM_CHECK(l.ndim <= kMaxDims && kept >= 0 && kept <= l.ndim, "sum: bad layout (ndim ", l.ndim,
            ", kept ", kept, ")");
  int64_t n_out = 1, n_red = 1;
  for (int d = 0; d < kept; d++) n_out *= l.shape[d];
  for (int d = kept; d < l.ndim; d++) n_red *= l.shape[d];
  if (n_out == 0) return;
  if (n_red == 0) {
    fill(out, t, 0.0, n_out, stream);
    return;
  }
  Ix kept_ix = collapse_part(l, 0, kept), red_ix = collapse_part(l, kept, l.ndim);
  dispatch_float(t, "sum", [&](auto tag) {
    using T = decltype(tag);
    sum_launch<T>(static_cast<T*>(out), static_cast<const T*>(in), kept_ix, red_ix, n_out, n_red,
                  stream);
  });
}

int64_t count_nonfinite(DType t, const void* x, int64_t n, void* stream) {
  if (n <= 0) return 0;
  auto* dcount = static_cast<unsigned long long*>(malloc_async(sizeof(unsigned long long), stream));
  memset_async(dcount, 0, sizeof(unsigned long long), stream);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    nonfinite_kernel<T>
        <<<flat_blocks(n), kThreads, 0, as_stream(stream)>>>(static_cast<const T*>(x), n, dcount);
    check_last_launch("count_nonfinite");
  };
  switch (t) {
  case DType::f32: launch(float{}); break;
  case DType::bf16: launch(bf16_t{}); break;
  case DType::f64: launch(double{}); break;
  default:
    free_async(dcount, stream);
    VLM_FAIL("count_nonfinite: not a float dtype: ", dtype_name(t));
  }
  unsigned long long host = 0;
  memcpy_d2h(&host, dcount, sizeof host, stream);
  free_async(dcount, stream);
  stream_synchronize(stream);
  return int64_t(host);
}

} // namespace vlm::kernels::cuda
