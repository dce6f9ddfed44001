// The decoder layer of every Qwen text stack (qwen-models.md §1.2, §3.2-3.4): a pre-RMSNorm token
// mixer (softmax attention, "self_attn", or Gated DeltaNet, "linear_attn") and a feed-forward (the
// SwiGLU MLP, or a kind the family passes), both residual:
//   x1 = x + mixer(input_layernorm(x));  out = x1 + mlp(post_attention_layernorm(x1)).
// Qwen3 / Qwen3-VL norms are plain (w ⊙ x̂), Qwen3.5's zero-centred ((1 + w) ⊙ x̂). Parameter
// names are transformers': <mixer>.*, mlp.{gate,up,down}_proj, input_layernorm,
// post_attention_layernorm.
#pragma once

#include <memory>
#include <string>

#include "model/text/mlp.h"
#include "model/text/self_attention.h"
#include "model/text/text_block.h"
#include "src/nn/rms_norm.h"

namespace vlm::model {

// The sizes of a Qwen3-style decoder layer (from a family's config).
struct DecoderLayerConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;
  double initializer_range = 0.02;
  bool zero_centered_norms = false;   // Qwen3.5 (every norm of the layer, q/k norms included)
  bool attention_output_gate = false; // Qwen3.5's gated attention

  SelfAttentionConfig attention() const;
};

class DecoderLayer : public TextBlock {
public:
  // A softmax-attention layer (self_attn).
  DecoderLayer(const DecoderLayerConfig& config, DType dtype);
  // A layer around another mixer, registered under `mixer_name` ("linear_attn").
  DecoderLayer(const DecoderLayerConfig& config, const std::string& mixer_name,
               std::shared_ptr<TokenMixer> mixer, DType dtype);
  // ... and another feed-forward kind (registered as "mlp", as transformers names both the dense
  // MLP and a mixture of experts); the SwiGLU MLP otherwise.
  DecoderLayer(const DecoderLayerConfig& config, const std::string& mixer_name,
               std::shared_ptr<TokenMixer> mixer, std::shared_ptr<FeedForward> feed_forward,
               DType dtype);
  std::string type_name() const override { return "DecoderLayer"; }

  Tensor forward(const Tensor& x, const BlockContext& ctx) const override;

private:
  std::shared_ptr<TokenMixer> mixer_;
  std::shared_ptr<FeedForward> feed_forward_;
  std::shared_ptr<nn::RMSNorm> in_norm_, post_norm_;
};

} // namespace vlm::model
