// What the gated delta rule's CUDA files (gated_delta.cu: the recurrence, gated_delta_chunk.cu:
// the chunked form) share: the shape and offsets checks, stream-ordered scratch and the GVA head
// sum. For .cu files under kernels/cuda only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/gated_delta.h"
#include "kernels/gpu_runtime.h"

namespace vlm::kernels::cuda::gdn {

// Tokens per chunk of the chunked form and of the backward's stored states, as an int.
constexpr int kChunk = int(kGatedDeltaChunk);

struct Dims {
  int HK, HV, dk, dv, group; // group = HV / HK
  float scale;
};

// The shape as ints, refusing what the kernels do not handle (dk or dv above kGatedDeltaMaxDim,
// sizes past the launch limits).
inline Dims dims_of(const GatedDeltaShape& s, const char* op) {
  VLM_CHECK(s.tokens >= 0 && s.k_heads > 0 && s.v_heads > 0 && s.v_heads % s.k_heads == 0 &&
                s.k_dim > 0 && s.v_dim > 0 && s.docs >= 1,
            op, ": bad shape T=", s.tokens, " HK=", s.k_heads, " HV=", s.v_heads, " dk=", s.k_dim,
            " dv=", s.v_dim, " docs=", s.docs);
  VLM_CHECK(s.k_dim <= kGatedDeltaMaxDim && s.v_dim <= kGatedDeltaMaxDim, op, ": dk=", s.k_dim,
            ", dv=", s.v_dim, " exceed ", kGatedDeltaMaxDim, " on CUDA");
  VLM_CHECK(s.v_heads <= 65535 && s.tokens <= INT32_MAX && s.docs * s.v_heads <= INT32_MAX, op,
            ": HV=", s.v_heads, ", T=", s.tokens, ", docs=", s.docs, " exceed the launch limits");
  return Dims{
      int(s.k_heads), int(s.v_heads), int(s.k_dim), int(s.v_dim), int(s.v_heads / s.k_heads),
      float(s.scale)};
}

// The documents of `s` on the device, with chunk starts for kGatedDeltaChunk-token chunks.
inline void check_offsets(const VarlenOffsets& o, const GatedDeltaShape& s, const char* op) {
  VLM_CHECK(o.docs == s.docs, op, ": offsets of ", o.docs, " documents for a shape of ", s.docs);
  VLM_CHECK(o.chunk == kGatedDeltaChunk, op, ": chunk starts of ", o.chunk,
            "-token chunks, the kernels cut ", kGatedDeltaChunk);
  VLM_CHECK(o.cu_seqlens != nullptr && o.chunk_starts != nullptr && o.chunks >= 0, op,
            ": no device offsets");
}

// Device memory freed (stream-ordered) when it goes out of scope.
struct Scratch {
  void* p = nullptr;
  cudaStream_t stream;
  Scratch(size_t bytes, cudaStream_t s) : p(malloc_async(bytes, s)), stream(s) {}
  ~Scratch() { free_async(p, stream); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

inline int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  VLM_CUDA_CHECK(cudaGetDevice(&device));
  VLM_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// dst[r, d] = Σ_{i < group} part[r · group + i, d] for r < rows, d < dim, i in order (the GVA
// sum of per-value-head dq / dk; also per-column-group partial sums). Defined in gated_delta.cu.
void sum_heads(float* dst, const float* part, int64_t rows, int group, int dim, cudaStream_t stream,
               const char* op);

} // namespace vlm::kernels::cuda::gdn
