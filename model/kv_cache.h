// What incremental decoding (model/generate.h) keeps of the tokens seen so far, per decoder
// layer: an attention layer's keys and values, a Gated DeltaNet layer's conv history and
// recurrent state. A forward whose Batch carries a KVCache is one document continuing the
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
    Tensor keys, values; // attention: [T_cached, kv_heads, head_dim] after q/k norm and RoPE
    // Gated DeltaNet: the last kernel_size - 1 conv inputs [K - 1, C] (zero rows before the
    // document start) and the delta-rule state [1, HV, dk, dv] (f32; f64 for f64 models).
    Tensor conv_history, state;
  };
  std::vector<Layer> layers; // sized by the model on the first forward

  int64_t tokens = 0; // tokens cached so far (0 before the prefill); the model advances it
};

// One attention layer's step with a cache: appends k, v ([T, kv_heads, D]) to `cache` and returns
// the attention of q ([T, heads, D]) over all cached keys: causal for the prefill (an empty cache),
// every key for a one-token step (T = 1; longer steps are refused).
Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, KVCache::Layer& cache,
                        double softmax_scale);

} // namespace vlm::model
