#include "model/text/decoder_layer.h"

#include <cmath>

#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

Qwen3DecoderLayer::Qwen3DecoderLayer(const DecoderLayerConfig& c, DType dtype)
    : head_dim_(c.head_dim) {
  nn::LinearOptions attn_opts;
  attn_opts.bias = c.attention_bias;
  attn_opts.weight_init = nn::Init::normal(c.initializer_range);
  attn_opts.dtype = dtype;
  nn::LinearOptions mlp_opts = attn_opts;
  mlp_opts.bias = false;
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.dtype = dtype;
  const int64_t H = c.hidden_size, q_dim = c.num_attention_heads * head_dim_,
                kv_dim = c.num_key_value_heads * head_dim_;

  // Registration order = HF's state-dict order.
  auto& attn = *register_module("self_attn", std::make_shared<nn::Module>());
  q_ = attn.register_module("q_proj", std::make_shared<nn::Linear>(H, q_dim, attn_opts));
  k_ = attn.register_module("k_proj", std::make_shared<nn::Linear>(H, kv_dim, attn_opts));
  v_ = attn.register_module("v_proj", std::make_shared<nn::Linear>(H, kv_dim, attn_opts));
  o_ = attn.register_module("o_proj", std::make_shared<nn::Linear>(q_dim, H, attn_opts));
  q_norm_ = attn.register_module("q_norm", std::make_shared<nn::RMSNorm>(head_dim_, norm_opts));
  k_norm_ = attn.register_module("k_norm", std::make_shared<nn::RMSNorm>(head_dim_, norm_opts));
  auto& mlp = *register_module("mlp", std::make_shared<nn::Module>());
  gate_ = mlp.register_module("gate_proj",
                              std::make_shared<nn::Linear>(H, c.intermediate_size, mlp_opts));
  up_ = mlp.register_module("up_proj",
                            std::make_shared<nn::Linear>(H, c.intermediate_size, mlp_opts));
  down_ = mlp.register_module("down_proj",
                              std::make_shared<nn::Linear>(c.intermediate_size, H, mlp_opts));
  in_norm_ = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(H, norm_opts));
  post_norm_ =
      register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(H, norm_opts));
}

Tensor Qwen3DecoderLayer::forward(const Tensor& x, const Tensor& cu_seqlens,
                                  const RopeTables& rope_t, KVCache::Layer* cache) const {
  const int64_t T = x.size(0);
  // Head counts from the local weights: tensor parallelism shards q/k/v by heads.
  const int64_t heads = q_->weight().size(0) / head_dim_;
  const int64_t kv_heads = k_->weight().size(0) / head_dim_;
  // Attention: q/k RMSNorm per head (over D) before RoPE; GQA inside the attention op.
  Tensor h = in_norm_->forward(x);
  Tensor q = q_norm_->forward(reshape(q_->forward(h), {T, heads, head_dim_}));
  Tensor k = k_norm_->forward(reshape(k_->forward(h), {T, kv_heads, head_dim_}));
  Tensor v = reshape(v_->forward(h), {T, kv_heads, head_dim_});
  q = rope(q, rope_t);
  k = rope(k, rope_t);
  const double softmax_scale = 1.0 / std::sqrt(double(head_dim_));
  Tensor a = cache ? cached_attention(q, k, v, *cache, softmax_scale)
                   : attention(q, k, v, cu_seqlens, /*causal=*/true, softmax_scale);
  Tensor x1 = add(x, o_->forward(reshape(a, {T, heads * head_dim_})));
  // MLP: down(silu(gate(h)) * up(h)).
  Tensor h2 = post_norm_->forward(x1);
  Tensor gu = swiglu(gate_->forward(h2), up_->forward(h2));
  return add(x1, down_->forward(gu));
}

} // namespace vlm::model
