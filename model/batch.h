// One micro-batch for any model family (DESIGN.md §4.1): packed documents back to back, T tokens
// in all. Several packed rows are simply concatenated (cu_seqlens offset), so T is the total token
// count and attention stays within each document of cu_seqlens.
#pragma once

#include <cstdint>

#include "src/core/tensor.h"

namespace vlm::model {

struct KVCache;

struct Batch {
  Tensor input_ids; // [T] i64 (i32 accepted)
  // [T] i64 (i32 accepted) next-token targets: position t is scored against targets[t];
  // -100 = ignored. Undefined for a forward without loss.
  Tensor targets;
  // [T] i64 (i32 accepted), restarting at 0 per document; [3, T] (planes t, h, w) for MRoPE.
  Tensor position_ids;
  Tensor cu_seqlens; // [docs + 1] i32 on the CPU, 0 = cu_seqlens[0] <= ... <= cu_seqlens[docs] = T
  // Targets that are not -100, counted on the host before a move to a GPU (to_device); -1 =
  // count them from `targets` when asked.
  int64_t num_targets = -1;
  // Vision inputs (VLMs): [patches, channels · temporal_patch · patch²] f32 and [images, 3] i64
  // (t, h, w in patches per image). Undefined for text.
  Tensor pixel_values;
  Tensor image_grid_thw; // read on the host only: to_device keeps it on the CPU
  // [T] i64 on the CPU: input_ids as the host had them before to_device moved them to a GPU, for
  // what only the host reads (the image placeholder positions) without a read-back. Undefined
  // when input_ids are on the CPU.
  Tensor host_input_ids;
  // Incremental decoding (model/kv_cache.h): the batch is one document continuing the cached
  // tokens (position ids included), and the forward extends the cache. Null when training.
  KVCache* kv_cache = nullptr;

  int64_t num_tokens() const { return input_ids.defined() ? input_ids.numel() : 0; }
};

// From HF-aligned labels (unshifted: labels[t] belongs to input_ids[t], the loss scores position t
// against labels[t + 1], the last position is ignored): targets = io::next_token_targets(labels)
// (io/loader/packing.h). Packed rows must carry -100 on each document's first label, so no target
// crosses a document. Accepts [T] or [1, T] tensors (i32 / i64; cu_seqlens i32 / i64) and returns
// the [T] forms with i64 ids, targets and positions and i32 cu_seqlens.
Batch batch_from_labels(const Tensor& input_ids, const Tensor& labels, const Tensor& position_ids,
                        const Tensor& cu_seqlens);

// Targets that are not -100 (batch.num_targets when it is set).
int64_t count_targets(const Batch& batch);

// Checks a batch on the host before it goes to a device, so no kernel has to check (or
// synchronize) later: input ids in [0, vocab_size), targets -100 or in [0, vocab_size), position
// ids [T] or [3, T] and >= 0, cu_seqlens [docs + 1] from 0 to T, non-decreasing. Each error names
// the tensor, the position and the value. Device tensors are read back (tests only do that).
void validate_batch(const Batch& batch, int64_t vocab_size);

// The batch for a model on `device`: input ids, targets (optional) and position ids as i64, on a
// GPU in one asynchronous copy from a pinned staging buffer (Tensor::empty_pinned); cu_seqlens
// stays on the CPU, where attention reads its offsets without a synchronization, and so do
// image_grid_thw and a host copy of the ids (host_input_ids); num_targets is set (0 without
// targets). Pixel values, when present, are moved as they are.
Batch to_device(const Batch& batch, Device device);

} // namespace vlm::model
