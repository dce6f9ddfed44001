#include "model/text/text_model.h"

#include "src/core/ops/elementwise.h"

namespace vlm::model {

TextModel::TextModel(const TextStackOptions& o, DType dtype) {
  // Registration order = HF's state-dict order.
  embed_ = register_module("embed_tokens", std::make_shared<nn::Embedding>(
                                               o.vocab_size, o.hidden_size,
                                               nn::Init::normal(o.initializer_range), dtype));
  layers_ = register_module(kLayers, std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < o.num_layers; i++) layers_->append(o.make_layer(i));
  nn::RMSNormOptions norm_opts = o.final_norm;
  norm_opts.dtype = dtype;
  norm_ = register_module("norm", std::make_shared<nn::RMSNorm>(o.hidden_size, norm_opts));
}

Tensor TextModel::embed(const Tensor& input_ids) const { return embed_->forward(input_ids); }

std::vector<nn::Module*> TextModel::layers() const {
  std::vector<nn::Module*> out;
  for (size_t i = 0; i < layers_->size(); i++) out.push_back(&(*layers_)[i]);
  return out;
}

Tensor TextModel::forward(Tensor x, BlockContext ctx, KVCache* cache,
                          const std::vector<Tensor>& layer_addends) const {
  VLM_CHECK(layer_addends.size() <= layers_->size(), "TextModel: ", layer_addends.size(),
            " layer addends for ", layers_->size(), " layers");
  if (cache) cache->layers.resize(layers_->size());
  // in = {x, addends...}: the rows of the same tokens (a wrapper may hand each rank a block).
  auto run_layers = [this, ctx, cache](const std::vector<Tensor>& in) mutable {
    Tensor h = in[0];
    for (size_t i = 0; i < layers_->size(); i++) {
      const auto& layer = static_cast<const TextBlock&>((*layers_)[i]);
      ctx.cache = cache ? &cache->layers[i] : nullptr;
      // Captured by value: a wrapper (activation checkpointing) may run this again in backward.
      auto forward = [&layer, ctx](const std::vector<Tensor>& layer_in) {
        return std::vector<Tensor>{layer.forward(layer_in[0], ctx)};
      };
      h = layer.call(forward, {h})[0];
      if (i + 1 < in.size()) h = add(h, in[i + 1]);
    }
    return std::vector<Tensor>{h};
  };
  std::vector<Tensor> in{x};
  in.insert(in.end(), layer_addends.begin(), layer_addends.end());
  x = layers_->has_forward_hooks() ? layers_->call(run_layers, in)[0] : run_layers(in)[0];
  if (cache) cache->tokens += x.size(0);
  return norm_->forward(x);
}

} // namespace vlm::model
