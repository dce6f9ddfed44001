// The varlen layout of a packed batch (DESIGN.md §4.1): the documents' offsets, checked once per
// batch and handed to every op that must keep documents apart (attention, the causal conv1d, the
// gated delta rule), forward and backward, instead of each op re-reading and re-checking
// cu_seqlens per layer.
#pragma once

#include <cstdint>

#include "src/core/tensor.h"

namespace vlm {

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
};

} // namespace vlm
