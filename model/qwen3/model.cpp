#include "model/qwen3/model.h"

#include <cmath>
#include <vector>

#include "model/qwen3/flops.h"
#include "src/core/autograd.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

// --- decoder layer -------------------------------------------------------------------------------

Qwen3DecoderLayer::Qwen3DecoderLayer(const Qwen3Config& c, DType dtype) : head_dim_(c.head_dim) {
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
                                  const RopeTables& rope_t) const {
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
  Tensor a = attention(q, k, v, cu_seqlens, /*causal=*/true, 1.0 / std::sqrt(double(head_dim_)));
  Tensor x1 = add(x, o_->forward(reshape(a, {T, heads * head_dim_})));
  // MLP: down(silu(gate(h)) * up(h)).
  Tensor h2 = post_norm_->forward(x1);
  Tensor gu = swiglu(gate_->forward(h2), up_->forward(h2));
  return add(x1, down_->forward(gu));
}

// --- causal LM -----------------------------------------------------------------------------------

Qwen3ForCausalLM::Qwen3ForCausalLM(const Qwen3Config& config, DType param_dtype)
    : config_(config), dtype_(param_dtype) {
  config_.validate();
  VLM_CHECK(param_dtype == DType::f32 || param_dtype == DType::bf16 || param_dtype == DType::f64,
            "Qwen3ForCausalLM: parameter dtype must be f32, bf16 or f64, got ",
            dtype_name(param_dtype));
  const auto& c = config_;
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.dtype = dtype_;
  auto& model = *register_module("model", std::make_shared<nn::Module>());
  embed_ = model.register_module(
      "embed_tokens",
      std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size,
                                      nn::Init::normal(c.initializer_range), dtype_));
  layers_ = model.register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; i++)
    layers_->append(std::make_shared<Qwen3DecoderLayer>(c, dtype_));
  norm_ = model.register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, norm_opts));
  if (!c.tie_word_embeddings) {
    nn::LinearOptions head_opts;
    head_opts.weight_init = nn::Init::normal(c.initializer_range);
    head_opts.dtype = dtype_;
    lm_head_ = register_module(
        "lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, head_opts));
  }
}

const Tensor& Qwen3ForCausalLM::head_weight() const {
  return lm_head_ ? lm_head_->weight() : embed_->weight();
}

std::vector<nn::Module*> Qwen3ForCausalLM::blocks() const {
  std::vector<nn::Module*> out;
  for (size_t i = 0; i < layers_->size(); i++) out.push_back(&(*layers_)[i]);
  return out;
}

ParamRole Qwen3ForCausalLM::param_role(const std::string& name) const {
  return {ParamGroup::llm, param_kind_by_name(name)};
}

TrainingFlops Qwen3ForCausalLM::training_flops(const std::vector<int32_t>& cu_seqlens,
                                               int64_t num_real_docs) const {
  return qwen3_training_flops(config_, cu_seqlens, num_real_docs);
}

void Qwen3ForCausalLM::check_batch(const Batch& b) const {
  VLM_CHECK(b.input_ids.defined() && b.input_ids.dim() == 1 && b.input_ids.numel() > 0,
            "Qwen3ForCausalLM: input_ids must be a non-empty [T] tensor, got ",
            b.input_ids.defined() ? b.input_ids.desc() : std::string("nothing"));
  const Shape& s = b.input_ids.shape();
  VLM_CHECK(b.position_ids.defined() && b.position_ids.shape() == s,
            "Qwen3ForCausalLM: position_ids must be [T] like ", describe("input_ids", b.input_ids),
            ", got ", b.position_ids.defined() ? b.position_ids.desc() : std::string("nothing"));
  VLM_CHECK(!b.targets.defined() || b.targets.shape() == s, "Qwen3ForCausalLM: targets must be [T]",
            " like ", describe("input_ids", b.input_ids), ", got ",
            b.targets.defined() ? b.targets.desc() : std::string("nothing"));
  VLM_CHECK(b.cu_seqlens.defined(), "Qwen3ForCausalLM: the batch has no cu_seqlens");
  VLM_CHECK(!b.pixel_values.defined(), "Qwen3ForCausalLM: a text model takes no pixel_values (",
            b.pixel_values.desc(), ")");
}

Tensor Qwen3ForCausalLM::hidden_states(const Batch& b) const {
  check_batch(b);
  const RopeTables rope_t =
      rope_tables(b.position_ids, config_.head_dim, config_.rope_theta, dtype_);
  Tensor x = embed_->forward(b.input_ids);
  for (nn::Module* block : blocks()) {
    const auto& layer = static_cast<const Qwen3DecoderLayer&>(*block);
    // Captured by value: a wrapper (activation checkpointing) may run this again in backward.
    auto forward = [&layer, cu_seqlens = b.cu_seqlens, rope_t](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{layer.forward(in[0], cu_seqlens, rope_t)};
    };
    x = layer.call(forward, {x})[0];
  }
  return norm_->forward(x);
}

} // namespace vlm::model
