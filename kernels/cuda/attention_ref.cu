// Reference attention kernels for tests (attention_ref_*, declared in kernels/attention.h): a
// thread per query row (or key row) that finds its document by binary search in cu_seqlens, with
// the CPU kernel's two-pass softmax; slow, and kept apart from the flash kernels.
#include <cmath>

#include "kernels/cuda/attention_tiles.cuh"

namespace vlm::kernels::cuda {
namespace {

using namespace attn;

constexpr int kRefThreads = 64, kRefMaxD = 256;

// The document holding token t: the b with cu[b] <= t < cu[b + 1] (empty documents skipped).
__device__ int find_doc(const int32_t* cu, int docs, int64_t t) {
  int lo = 0, hi = docs - 1; // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The query row of a forward / dQ thread: token t, query head h = blockIdx.y and its kv head g,
// the first token of t's document, how many keys t sees and its (token, head) row.
struct RefQuery {
  int g;
  int64_t start, visible, row;
};
__device__ __forceinline__ RefQuery ref_query(const int32_t* cu, int docs, int64_t t, int Hq,
                                              int Hkv, bool causal) {
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int b = find_doc(cu, docs, t);
  const int64_t start = cu[b], len = cu[b + 1] - start, i = t - start;
  return {g, start, causal ? i + 1 : len, t * Hq + h};
}

template <typename T> __device__ float dot_rows(const T* a, const T* b, int D) {
  float s = 0.f;
  for (int d = 0; d < D; d++) s += to_f32(a[d]) * to_f32(b[d]);
  return s;
}

template <typename T>
__global__ void ref_fwd_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                               const int32_t* cu, int docs, int64_t tokens, int Hq, int Hkv, int D,
                               float scale, bool causal) {
  const int64_t t = blockIdx.x * int64_t(kRefThreads) + threadIdx.x;
  if (t >= tokens) return;
  const auto [g, start, visible, row] = ref_query(cu, docs, t, Hq, Hkv, causal);
  const T* qr = q + row * D;
  float m = -INFINITY;
  for (int64_t j = 0; j < visible; j++)
    m = fmaxf(m, scale * dot_rows(qr, k + ((start + j) * Hkv + g) * D, D));
  float acc[kRefMaxD];
  for (int d = 0; d < D; d++) acc[d] = 0.f;
  float denom = 0.f;
  for (int64_t j = 0; j < visible; j++) {
    const int64_t kv = ((start + j) * Hkv + g) * D;
    const float p = expf(scale * dot_rows(qr, k + kv, D) - m);
    denom += p;
    for (int d = 0; d < D; d++) acc[d] += p * to_f32(v[kv + d]);
  }
  const float inv = 1.f / denom;
  for (int d = 0; d < D; d++) out[row * D + d] = from_f32<T>(acc[d] * inv);
  lse[row] = m + logf(denom);
}

template <typename T>
__global__ void ref_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v,
                              const T* out, const float* lse, const int32_t* cu, int docs,
                              int64_t tokens, int Hq, int Hkv, int D, float scale, bool causal) {
  const int64_t t = blockIdx.x * int64_t(kRefThreads) + threadIdx.x;
  if (t >= tokens) return;
  const auto [g, start, visible, row] = ref_query(cu, docs, t, Hq, Hkv, causal);
  const float delta = dot_rows(dout + row * D, out + row * D, D);
  float acc[kRefMaxD];
  for (int d = 0; d < D; d++) acc[d] = 0.f;
  for (int64_t j = 0; j < visible; j++) {
    const int64_t kv = ((start + j) * Hkv + g) * D;
    const float p = expf(scale * dot_rows(q + row * D, k + kv, D) - lse[row]);
    const float ds = p * (dot_rows(dout + row * D, v + kv, D) - delta);
    for (int d = 0; d < D; d++) acc[d] += ds * to_f32(k[kv + d]);
  }
  for (int d = 0; d < D; d++) dq[row * D + d] = from_f32<T>(scale * acc[d]);
}

template <typename T>
__global__ void ref_dkv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                               const T* out, const float* lse, const int32_t* cu, int docs,
                               int64_t tokens, int Hq, int Hkv, int D, float scale, bool causal) {
  const int64_t t = blockIdx.x * int64_t(kRefThreads) + threadIdx.x;
  if (t >= tokens) return;
  const int g = blockIdx.y, group = Hq / Hkv;
  const int b = find_doc(cu, docs, t);
  const int64_t start = cu[b], len = cu[b + 1] - start, j = t - start;
  const int64_t kv = (t * Hkv + g) * D;
  float dk_acc[kRefMaxD], dv_acc[kRefMaxD];
  for (int d = 0; d < D; d++) dk_acc[d] = dv_acc[d] = 0.f;
  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int64_t i = causal ? j : 0; i < len; i++) {
      const int64_t row = (start + i) * Hq + h;
      const float delta = dot_rows(dout + row * D, out + row * D, D);
      const float p = expf(scale * dot_rows(q + row * D, k + kv, D) - lse[row]);
      const float ds = p * (dot_rows(dout + row * D, v + kv, D) - delta);
      for (int d = 0; d < D; d++) {
        dv_acc[d] += p * to_f32(dout[row * D + d]);
        dk_acc[d] += ds * to_f32(q[row * D + d]);
      }
    }
  }
  for (int d = 0; d < D; d++) {
    dk[kv + d] = from_f32<T>(scale * dk_acc[d]);
    dv[kv + d] = from_f32<T>(dv_acc[d]);
  }
}

dim3 ref_grid(int64_t rows, int64_t heads) {
  return dim3(unsigned((rows + kRefThreads - 1) / kRefThreads), unsigned(heads));
}

} // namespace

template <typename T>
void attention_ref_fwd(T* out, float* lse, const T* q, const T* k, const T* v,
                       const int32_t* cu_seqlens_device, const AttentionShape& s, void* stream) {
  check_shape(s, "attention_ref_fwd");
  if (s.tokens == 0) return;
  ref_fwd_kernel<<<ref_grid(s.tokens, s.q_heads), kRefThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(
      dptr(out), lse, dptr(q), dptr(k), dptr(v), cu_seqlens_device, int(s.docs), s.tokens,
      int(s.q_heads), int(s.kv_heads), int(s.head_dim), float(s.scale), s.causal);
  check_last_launch("attention_ref_fwd");
}

template <typename T>
void attention_ref_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                       const T* out, const float* lse, const int32_t* cu_seqlens_device,
                       const AttentionShape& s, void* stream) {
  check_shape(s, "attention_ref_bwd");
  if (s.tokens == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  ref_dq_kernel<<<ref_grid(s.tokens, s.q_heads), kRefThreads, 0, st>>>(
      dptr(dq), dptr(dout), dptr(q), dptr(k), dptr(v), dptr(out), lse, cu_seqlens_device,
      int(s.docs), s.tokens, int(s.q_heads), int(s.kv_heads), int(s.head_dim), float(s.scale),
      s.causal);
  check_last_launch("attention_ref_bwd (dq)");
  ref_dkv_kernel<<<ref_grid(s.tokens, s.kv_heads), kRefThreads, 0, st>>>(
      dptr(dk), dptr(dv), dptr(dout), dptr(q), dptr(k), dptr(v), dptr(out), lse, cu_seqlens_device,
      int(s.docs), s.tokens, int(s.q_heads), int(s.kv_heads), int(s.head_dim), float(s.scale),
      s.causal);
  check_last_launch("attention_ref_bwd (dk, dv)");
}

#define VLM_INSTANTIATE(T)                                                                         \
  template void attention_ref_fwd<T>(T*, float*, const T*, const T*, const T*, const int32_t*,     \
                                     const AttentionShape&, void*);                                \
  template void attention_ref_bwd<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                     const float*, const int32_t*, const AttentionShape&, void*);
VLM_INSTANTIATE(float)
VLM_INSTANTIATE(vlm::bf16)
#undef VLM_INSTANTIATE

} // namespace vlm::kernels::cuda
