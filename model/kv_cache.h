// Keys and values of the tokens seen so far, per decoder layer, for incremental decoding
// (model/generate.h). A forward whose Batch carries a KVCache is one document continuing the
// cached one: the first (prefill) runs the prompt with causal attention and fills the cache; each
// later forward adds one token, whose query attends to every cached key and its own, so its
// layers run on one token instead of the whole sequence. No gradients flow through a cache.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/tensor.h"

namespace vlm::model {

struct KVCache {
  struct Layer {
    Tensor keys, values; // [T_cached, kv_heads, head_dim] after q/k norm and RoPE
  };
  std::vector<Layer> layers; // sized by the model on the first forward

  // Tokens cached so far (0 before the prefill).
  int64_t length() const;
};

// One attention layer's step with a cache: appends k, v ([T, kv_heads, D]) to `cache` and returns
// the attention of q ([T, heads, D]) over all cached keys: causal for the prefill (an empty cache),
// every key for a one-token step (T = 1; longer steps are refused).
Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, KVCache::Layer& cache,
                        double softmax_scale);

} // namespace vlm::model
