// Qwen3 dense text model (qwen-models.md §1) with transformers' parameter names, so HF
// checkpoints load by name: model.embed_tokens.weight, model.layers.N.{input_layernorm,
// self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm,
// mlp.{gate,up,down}_proj} .weight (+ .bias on q/k/v/o with attention_bias), model.norm.weight, and
// lm_head.weight only when the head is not tied to the embeddings.
//
// Computation: every activation in the parameter dtype (f32, bf16 — real bf16 storage on CPU,
// DESIGN.md §4 — or f64 for finite-difference tests), with HF's rounding points (RMSNorm rounds
// x̂ before the weight product; RoPE tables rounded to the activation dtype). Batches are packed
// (model/batch.h): attention causal within each document of cu_seqlens, position ids restarting
// per document. The head and the loss are model/lm_loss.h's, as for every family.
//
// Life cycle (DESIGN.md §2): the constructor only declares parameters; then either
// init_weights(rng) (HF initialisation) or load_hf_weights (model/hf_weights.h) allocates them.
// Activation checkpointing and FSDP wrap the decoder layers from outside (parallel/): each layer
// runs through nn::Module::call, and derives its head counts from its (possibly sharded) q/k/v
// weights.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/qwen3/config.h"
#include "model/text/text_causal_lm.h"

namespace vlm::model {

class Qwen3ForCausalLM : public FamilyLM<Qwen3Config> {
public:
  // Declares every parameter in `param_dtype` (f32, bf16 or f64); validates the config.
  explicit Qwen3ForCausalLM(const Qwen3Config& config, DType param_dtype = DType::f32);
  std::string type_name() const override { return "Qwen3ForCausalLM"; }

  bool tied() const { return config_.tie_word_embeddings; }
  const nn::Embedding& embed_tokens() const { return text_->embed_tokens(); }

  // --- CausalLM ---------------------------------------------------------------------------------
  std::string model_type() const override { return "qwen3"; }
  Tensor hidden_states(const Batch& batch) const override;
  // The decoder layers.
  std::vector<nn::Module*> blocks() const override;
  // Everything is the language model; kinds by param_kind_by_name.
  ParamRole param_role(const std::string& name) const override;
  TrainingFlops
  training_flops(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs = -1,
                 const std::vector<std::array<int64_t, 3>>& image_grids = {}) const override;
};

} // namespace vlm::model
