// The Qwen3 decoder layer (qwen-models.md §1.2), shared by the text stacks of Qwen3 and Qwen3-VL
// (its full-attention layers differ in Qwen3.5): pre-RMSNorm GQA attention with per-head q/k
// RMSNorm and (M)RoPE, causal within each document of cu_seqlens, then a SwiGLU MLP, both
// residual. Parameter names are transformers': self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
// mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm.
//
// The layer derives its head counts from its (possibly sharded) q/k/v weights, so tensor
// parallelism can shard them by heads from outside.
#pragma once

#include <memory>
#include <string>

#include "model/kv_cache.h"
#include "src/core/ops/rope.h"
#include "src/nn/linear.h"
#include "src/nn/rms_norm.h"

namespace vlm::model {

// The sizes a decoder layer needs (from a family's config).
struct DecoderLayerConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;
  double initializer_range = 0.02;
};

class Qwen3DecoderLayer : public nn::Module {
public:
  Qwen3DecoderLayer(const DecoderLayerConfig& config, DType dtype);
  std::string type_name() const override { return "Qwen3DecoderLayer"; }

  // x: [T, H] -> [T, H]; rope: tables for the T positions (rope_tables or mrope_tables).
  // With a cache (incremental decoding, model/kv_cache.h) cu_seqlens is not read: x continues
  // the cached document.
  Tensor forward(const Tensor& x, const Tensor& cu_seqlens, const RopeTables& rope,
                 KVCache::Layer* cache = nullptr) const;

private:
  int64_t head_dim_;
  std::shared_ptr<nn::Linear> q_, k_, v_, o_, gate_, up_, down_;
  std::shared_ptr<nn::RMSNorm> q_norm_, k_norm_, in_norm_, post_norm_;
};

} // namespace vlm::model
