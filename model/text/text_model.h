// The text stack every family shares (DESIGN.md §4.1): token embeddings -> decoder layers made by
// a per-layer factory (so a stack can mix layer kinds: attention, gated attention, Gated
// DeltaNet) -> the final RMSNorm. Parameter names are transformers': embed_tokens.weight,
// layers.N.*, norm.weight, below whatever prefix the family registers it under ("model" for
// Qwen3, "model.language_model" for the VLMs).
//
// Each layer runs through nn::Module::call, so activation checkpointing and FSDP wrap it from
// outside (parallel/); the layer's forward captures its context by value, since a wrapper may
// run it again in backward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/text/text_block.h"
#include "src/nn/embedding.h"
#include "src/nn/rms_norm.h"

namespace vlm::model {

struct TextStackOptions {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  double initializer_range = 0.02;
  nn::RMSNormOptions final_norm;
  // Makes layer i (0-based).
  std::function<std::shared_ptr<TextBlock>(int64_t layer)> make_layer;
};

class TextModel : public nn::Module {
public:
  TextModel(const TextStackOptions& options, DType dtype);
  std::string type_name() const override { return "TextModel"; }

  const nn::Embedding& embed_tokens() const { return *embed_; }
  // ids [T] -> [T, H]
  Tensor embed(const Tensor& input_ids) const;
  // Runs every layer on x [T, H] with `ctx` (its cache pointer set per layer from `cache`, when
  // given), then the final norm. layer_addends[i] [T, H], when given, is added to x after layer i
  // (DeepStack: zero rows but at the image positions). The layers run as one call() of the
  // `layers` list on {x, addends...}, all rows of the same tokens, so sequence parallelism can
  // split them by rows from outside (parallel/tp/tensor_parallel.h).
  Tensor forward(Tensor x, BlockContext ctx, KVCache* cache,
                 const std::vector<Tensor>& layer_addends = {}) const;
  // The path of the layer list below this module, for plans.
  static constexpr const char* kLayers = "layers";
  // The decoder layers in forward order.
  std::vector<nn::Module*> layers() const;

private:
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::RMSNorm> norm_;
};

} // namespace vlm::model
