// What a layer of the shared text stack (model/text/text_model.h) is and what it is handed: every
// family's decoder layer is a TextBlock, and one BlockContext per forward carries what any layer
// kind may need, built once per batch. Inside a layer, the token mixer and the feed-forward are
// kinds of their own (model/text/decoder_layer.h).
#pragma once

#include "model/kv_cache.h"
#include "src/core/ops/rope.h"
#include "src/core/varlen.h"
#include "src/nn/module.h"

namespace vlm::model {

struct BlockContext {
  VarlenLayout varlen; // the batch's documents (a generation step: the one cached document)
  RopeTables rope;     // cos/sin of the T positions (rotary_dim <= head_dim)
  // Generation (model/kv_cache.h): this layer's cache; null when training. With a cache the
  // batch is one document continuing the cached tokens.
  KVCache::Layer* cache = nullptr;
};

// A layer of the text stack: x [T, H] -> [T, H].
class TextBlock : public nn::Module {
public:
  virtual Tensor forward(const Tensor& x, const BlockContext& ctx) const = 0;
};

// The token mixer inside a decoder layer (softmax attention, Gated DeltaNet): the normed input
// h [T, H] -> [T, H], before the residual add.
class TokenMixer : public nn::Module {
public:
  virtual Tensor forward(const Tensor& h, const BlockContext& ctx) const = 0;
};

// The feed-forward inside a decoder layer (the SwiGLU MLP; another kind, e.g. a mixture of
// experts, plugs in the same way): the normed h [T, H] -> [T, H], before the residual add.
class FeedForward : public nn::Module {
public:
  virtual Tensor forward(const Tensor& h, const BlockContext& ctx) const = 0;
};

} // namespace vlm::model
