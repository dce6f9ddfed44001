// The varlen layout of a packed batch (DESIGN.md §4.1): the documents' offsets, checked once per
// batch and handed to every op that must keep documents apart (attention, the causal conv1d, the
// gated delta rule), forward and backward, instead of each op re-reading and re-checking
// cu_seqlens per layer.
//
// The CUDA ops also need data derived from the offsets on the device (the attention kernels' tile
// lists, the offsets themselves, cuDNN's ragged layout). The layout builds each of them on the
// host at its first use on a device, uploads it once from pinned memory and keeps it: every
// layer's forward and backward of the batch then reads the same buffers, and no launch uploads
// anything. Copies of a layout share that cache, and so do layouts with equal offsets among the
// last few made (kRetainedLayouts in varlen.cpp): a batch seen again uploads nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention_tiles.h"
#include "kernels/varlen_offsets.h"
#include "src/core/tensor.h"

namespace vlm {

struct VarlenDeviceCache; // varlen.cpp

struct VarlenLayout {
  Tensor cu_seqlens;      // [docs + 1] i32 on the CPU: 0 = c[0] <= ... <= c[docs] = tokens
  int64_t docs = 0;       // documents (empty ones included)
  int64_t tokens = 0;     // T
  int64_t max_length = 0; // the longest document

  // Checks cu_seqlens ([docs + 1] i32 or i64, any device; a device tensor is read back) against
  // `tokens` and keeps an i32 host copy. Errors name the entry and its value.
  static VarlenLayout of(const Tensor& cu_seqlens, int64_t tokens);
  // One document of `tokens` tokens.
  static VarlenLayout single(int64_t tokens);

  // --- derived data on a CUDA device (for the ops' CUDA paths) ---------------------------------
  // Each is uploaded at its first use per (device, current stream of the device): the work queued
  // on that stream afterwards sees it, with no host synchronization. Pointers stay valid while a
  // copy of this layout lives. Only for layouts made by of() or single().

  // The offsets and, for chunks of kernels::kGatedDeltaChunk tokens, each document's first chunk
  // (kernels/varlen_offsets.h): what the conv1d and gated delta kernels read.
  kernels::VarlenOffsets device_offsets(Device device) const;
  // The attention tile list of `spec` (kernels/attention_tiles.h).
  kernels::TileList attention_tiles(Device device, const kernels::TileSpec& spec) const;
  // Any other image: `make` builds its bytes from this layout on first use; `key` names it and
  // everything `make` depends on beyond the offsets. A u8 tensor on `device` ([0] when empty).
  Tensor device_image(Device device, const std::string& key,
                      const std::function<std::vector<uint8_t>()>& make) const;

  // Images uploaded by all layouts of the process so far (tests: what a step uploads).
  static uint64_t device_uploads();

  std::shared_ptr<VarlenDeviceCache> device_cache; // shared by copies; set by of()
};

} // namespace vlm
