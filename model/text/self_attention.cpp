#include "model/text/self_attention.h"

#include <cmath>

#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

SelfAttention::SelfAttention(const SelfAttentionConfig& c, DType dtype)
    : config_(c), head_dim_(c.head_dim), output_gate_(c.output_gate) {
  nn::LinearOptions opts;
  opts.bias = c.attention_bias;
  opts.weight_init = nn::Init::normal(c.initializer_range);
  opts.dtype = dtype;
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.zero_centered = c.zero_centered_norms;
  norm_opts.dtype = dtype;
  const int64_t H = c.hidden_size, q_dim = c.num_attention_heads * head_dim_,
                kv_dim = c.num_key_value_heads * head_dim_;
  // Registration order = HF's state-dict order.
  q_ = register_module("q_proj",
                       std::make_shared<nn::Linear>(H, output_gate_ ? 2 * q_dim : q_dim, opts));
  k_ = register_module("k_proj", std::make_shared<nn::Linear>(H, kv_dim, opts));
  v_ = register_module("v_proj", std::make_shared<nn::Linear>(H, kv_dim, opts));
  o_ = register_module("o_proj", std::make_shared<nn::Linear>(q_dim, H, opts));
  q_norm_ = register_module("q_norm", std::make_shared<nn::RMSNorm>(head_dim_, norm_opts));
  k_norm_ = register_module("k_norm", std::make_shared<nn::RMSNorm>(head_dim_, norm_opts));
}

Tensor SelfAttention::forward(const Tensor& h, const BlockContext& ctx) const {
  const int64_t D = head_dim_;
  // Head counts from the local weights: tensor parallelism shards q/k/v by heads.
  const int64_t heads = q_->weight().size(0) / (output_gate_ ? 2 * D : D);
  const int64_t kv_heads = k_->weight().size(0) / D;
  Tensor q = q_->forward(h), gate;
  const int64_t T = q.size(0); // the tokens: h may be a block of them (sequence parallelism)
  if (output_gate_) {          // per head: [query | gate]
    const Tensor qg = reshape(q, {T, heads, 2 * D});
    q = copy(slice(qg, 2, 0, D));
    gate = reshape(copy(slice(qg, 2, D, 2 * D)), {T, heads * D});
  }
  // q/k norm and (M)RoPE per head in one kernel each (rms_norm_rope).
  q = q_norm_->forward_rope(reshape(q, {T, heads, D}), ctx.rope);
  const Tensor k = k_norm_->forward_rope(reshape(k_->forward(h), {T, kv_heads, D}), ctx.rope);
  const Tensor v = reshape(v_->forward(h), {T, kv_heads, D});
  const double softmax_scale = 1.0 / std::sqrt(double(D));
  const Tensor a = ctx.cache ? cached_attention(q, k, v, *ctx.cache, softmax_scale)
                             : attention(q, k, v, ctx.varlen, /*causal=*/true, softmax_scale);
  Tensor o = reshape(a, {T, heads * D});
  if (output_gate_) o = mul(o, sigmoid(gate));
  return o_->forward(o);
}

} // namespace vlm::model
