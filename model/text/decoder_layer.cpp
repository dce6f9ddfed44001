#include "model/text/decoder_layer.h"

#include "src/core/ops/elementwise.h"

namespace vlm::model {

SelfAttentionConfig DecoderLayerConfig::attention() const {
  SelfAttentionConfig a;
  a.hidden_size = hidden_size;
  a.num_attention_heads = num_attention_heads;
  a.num_key_value_heads = num_key_value_heads;
  a.head_dim = head_dim;
  a.rms_norm_eps = rms_norm_eps;
  a.attention_bias = attention_bias;
  a.output_gate = attention_output_gate;
  a.zero_centered_norms = zero_centered_norms;
  a.initializer_range = initializer_range;
  return a;
}

DecoderLayer::DecoderLayer(const DecoderLayerConfig& c, DType dtype)
    : DecoderLayer(c, "self_attn", std::make_shared<SelfAttention>(c.attention(), dtype), dtype) {}

DecoderLayer::DecoderLayer(const DecoderLayerConfig& c, const std::string& mixer_name,
                           std::shared_ptr<TokenMixer> mixer, DType dtype)
    : DecoderLayer(c, mixer_name, std::move(mixer),
                   std::make_shared<SwiGluMlp>(c.hidden_size, c.intermediate_size,
                                               c.initializer_range, dtype),
                   dtype) {}

DecoderLayer::DecoderLayer(const DecoderLayerConfig& c, const std::string& mixer_name,
                           std::shared_ptr<TokenMixer> mixer,
                           std::shared_ptr<FeedForward> feed_forward, DType dtype) {
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.zero_centered = c.zero_centered_norms;
  norm_opts.dtype = dtype;
  // Registration order = HF's state-dict order.
  mixer_ = register_module(mixer_name, std::move(mixer));
  feed_forward_ = register_module("mlp", std::move(feed_forward));
  in_norm_ =
      register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, norm_opts));
  post_norm_ = register_module("post_attention_layernorm",
                               std::make_shared<nn::RMSNorm>(c.hidden_size, norm_opts));
}

Tensor DecoderLayer::forward(const Tensor& x, const BlockContext& ctx) const {
  // x1 = x + mixer(...) and post_attention_layernorm(x1) in one kernel (add_rms_norm).
  const auto [x1, normed] = post_norm_->add_forward(x, mixer_->forward(in_norm_->forward(x), ctx));
  return add(x1, feed_forward_->forward(normed, ctx));
}

} // namespace vlm::model
