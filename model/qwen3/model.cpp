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
    layers_->append(std::make_shared<Qwen3DecoderLayer>(c.decoder_layer(), dtype_));
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
                                               int64_t num_real_docs,
                                               const std::vector<std::array<int64_t, 3>>&) const {
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
  const std::vector<nn::Module*> layers = blocks();
  if (b.kv_cache) b.kv_cache->layers.resize(layers.size());
  for (size_t i = 0; i < layers.size(); i++) {
    const auto& layer = static_cast<const Qwen3DecoderLayer&>(*layers[i]);
    KVCache::Layer* cache = b.kv_cache ? &b.kv_cache->layers[i] : nullptr;
    // Captured by value: a wrapper (activation checkpointing) may run this again in backward.
    auto forward = [&layer, cu_seqlens = b.cu_seqlens, rope_t,
                    cache](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{layer.forward(in[0], cu_seqlens, rope_t, cache)};
    };
    x = layer.call(forward, {x})[0];
  }
  return norm_->forward(x);
}

} // namespace vlm::model
