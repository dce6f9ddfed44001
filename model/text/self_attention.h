// Softmax self-attention of the Qwen text stacks (qwen-models.md §1.2, §3.3): GQA with per-head
// q/k RMSNorm before (M)RoPE, causal within each document. Qwen3.5's gated form doubles q_proj:
// its output viewed as [T, Hq, 2D] holds each head's query and then its gate, and the attention
// output is multiplied by sigmoid(gate) before o_proj; its q/k norms are zero-centred (1 + w).
// Parameter names are transformers': {q,k,v,o}_proj (+ .bias with attention_bias), {q,k}_norm.
//
// Head counts come from the (possibly sharded) q/k weights, so tensor parallelism can shard them
// by heads from outside.
#pragma once

#include <memory>

#include "model/text/text_block.h"
#include "src/nn/linear.h"
#include "src/nn/rms_norm.h"

namespace vlm::model {

struct SelfAttentionConfig {
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;
  bool output_gate = false;         // Qwen3.5: q_proj also makes a sigmoid gate per head
  bool zero_centered_norms = false; // Qwen3.5: q/k norms are (1 + w) ⊙ x̂
  double initializer_range = 0.02;
};

class SelfAttention : public TokenMixer {
public:
  SelfAttention(const SelfAttentionConfig& config, DType dtype);
  std::string type_name() const override { return "SelfAttention"; }
  Tensor forward(const Tensor& h, const BlockContext& ctx) const override;
  const SelfAttentionConfig& config() const { return config_; }

private:
  SelfAttentionConfig config_;
  int64_t head_dim_;
  bool output_gate_;
  std::shared_ptr<nn::Linear> q_, k_, v_, o_;
  std::shared_ptr<nn::RMSNorm> q_norm_, k_norm_;
};

} // namespace vlm::model
