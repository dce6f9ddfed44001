#include "model/text/text_model.h"

namespace vlm::model {

TextModel::TextModel(const TextStackOptions& o, DType dtype) {
  // Registration order = HF's state-dict order.
  embed_ = register_module("embed_tokens", std::make_shared<nn::Embedding>(
                                               o.vocab_size, o.hidden_size,
                                               nn::Init::normal(o.initializer_range), dtype));
  layers_ = register_module("layers", std::make_shared<nn::ModuleList>());
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
                          const std::function<Tensor(size_t, const Tensor&)>& after_layer) const {
  if (cache) cache->layers.resize(layers_->size());
  for (size_t i = 0; i < layers_->size(); i++) {
    const auto& layer = static_cast<const TextBlock&>((*layers_)[i]);
    ctx.cache = cache ? &cache->layers[i] : nullptr;
    // Captured by value: a wrapper (activation checkpointing) may run this again in backward.
    auto forward = [&layer, ctx](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{layer.forward(in[0], ctx)};
    };
    x = layer.call(forward, {x})[0];
    if (after_layer) x = after_layer(i, x);
  }
  if (cache) cache->tokens += x.size(0);
  return norm_->forward(x);
}

} // namespace vlm::model
