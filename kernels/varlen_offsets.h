// A packed batch's document offsets as the CUDA varlen kernels read them (the causal conv1d,
// kernels/conv1d.h; the gated delta rule, kernels/gated_delta.h): already on the device, so a
// launch uploads nothing. The layer above (src/core/varlen.h) builds the image once per batch with
// varlen_offsets_image and keeps it on the device for every layer's forward and backward.
#pragma once

#include <cstdint>
#include <vector>

namespace vlm::kernels {

struct VarlenOffsets {
  const int32_t* cu_seqlens = nullptr;   // device: [docs + 1], 0 .. T non-decreasing
  const int32_t* chunk_starts = nullptr; // device: [docs], the index of document b's first chunk
  int64_t docs = 0;
  int64_t chunk = 0;  // tokens per chunk of chunk_starts
  int64_t chunks = 0; // the documents' chunks in all (host value: sizes the kernels' scratch)
};

// The device image: cu's docs + 1 offsets, then each document's first chunk when every document is
// cut into chunks of `chunk` tokens from its start (an empty document has none); *chunks = the
// total. Throws when the total passes INT32_MAX.
std::vector<int32_t> varlen_offsets_image(const int32_t* cu, int64_t docs, int64_t chunk,
                                          int64_t* chunks);

} // namespace vlm::kernels
