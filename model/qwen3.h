// Qwen3 dense text model (qwen-models.md §1) with transformers' parameter names, so HF
// checkpoints load by name: model.embed_tokens.weight, model.layers.N.{input_layernorm,
// self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm,
// mlp.{gate,up,down}_proj} .weight (+ .bias on q/k/v/o with attention_bias), model.norm.weight, and
// lm_head.weight only when the head is not tied to the embeddings.
//
// Computation: every activation in the parameter dtype (f32, bf16 — real bf16 storage on CPU,
// DESIGN.md §4 — or f64 for finite-difference tests), with HF's rounding points (RMSNorm rounds
// x̂ before the weight product; RoPE tables rounded to the activation dtype); logits and the loss
// in fp32 (f64 for an f64 model). Batches are packed: T tokens of several documents back to back,
// attention causal within each document of cu_seqlens, position ids restarting per document.
// Several packed rows are simply concatenated (cu_seqlens offset), so T is the total token count.
//
// Life cycle (DESIGN.md §2): the constructor only declares parameters; then either
// init_weights(rng) (HF initialisation) or load_hf_weights (model/hf_weights.h) allocates them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/qwen3_config.h"
#include "src/base/rng.h"
#include "src/core/ops/rope.h"
#include "src/core/tensor.h"
#include "src/nn/embedding.h"
#include "src/nn/linear.h"
#include "src/nn/module.h"
#include "src/nn/rms_norm.h"

namespace vlm::model {

class MatmulStash;

// One micro-batch of packed text.
struct TextBatch {
  Tensor input_ids; // [T] i64 (i32 accepted)
  // [T] i64 (i32 accepted) next-token targets: position t is scored against targets[t];
  // -100 = ignored.
  Tensor targets;
  Tensor position_ids; // [T] i64 (i32 accepted), restarting at 0 per document
  Tensor cu_seqlens;   // [docs + 1] i32, 0 = cu_seqlens[0] <= ... <= cu_seqlens[docs] = T
  // Targets that are not -100, counted on the host before a move to a GPU (to_device); -1 =
  // count them from `targets` when asked.
  int64_t num_targets = -1;
};

// From HF-aligned labels (unshifted: labels[t] belongs to input_ids[t], the loss scores position t
// against labels[t + 1], the last position is ignored): targets[t] = labels[t + 1],
// targets[T - 1] = -100 — the rule of io::next_token_targets (io/packing.h). Packed rows must carry
// -100 on each document's first label, so no target crosses a document. Accepts [T] or [1, T]
// tensors (i32 / i64; cu_seqlens i32 / i64) and returns the [T] forms with i64 ids, targets and
// positions and i32 cu_seqlens.
TextBatch text_batch_from_labels(const Tensor& input_ids, const Tensor& labels,
                                 const Tensor& position_ids, const Tensor& cu_seqlens);
// Targets that are not -100 (batch.num_targets when it is set).
int64_t count_targets(const TextBatch& batch);

// The batch for a model on `device`: input ids, targets (optional) and position ids as i64, on a
// GPU in one asynchronous copy from a pinned staging buffer (Tensor::empty_pinned); cu_seqlens
// stays on the CPU, where attention reads its offsets without a synchronization; num_targets is
// set (0 without targets).
TextBatch to_device(const TextBatch& batch, Device device);

// Activation checkpointing of the decoder layers:
//   off       everything the backward needs stays in memory;
//   full      each layer runs under checkpoint(): only its input is kept, the whole layer is
//             recomputed in backward (one extra forward);
//   selective each layer runs under checkpoint() with a MatmulStash (model/selective_ac.h): its
//             input and the outputs of its 7 projections (q, k, v, o, gate, up, down) are kept;
//             backward recomputes the cheap ops between them — input/post-attention RMSNorm,
//             q/k RMSNorm, RoPE, the attention core (softmax(qk^T)v; its FLOPs are ~12·Hq·D·ctx
//             per token, cheap next to the projections at short context, and its output is not
//             kept), SwiGLU and the residual adds — but no GEMM.
// All three give bit-identical losses and gradients. Embeddings, the final norm, the head and the
// loss are never checkpointed. With grad mode off the mode has no effect.
enum class ActivationCheckpointing : uint8_t { off, full, selective };
const char* activation_checkpointing_name(ActivationCheckpointing ac);
// "off" | "full" | "selective" (and "sac", the reference trainer's name for selective).
ActivationCheckpointing parse_activation_checkpointing(const std::string& name);

struct ForwardOptions {
  ActivationCheckpointing ac = ActivationCheckpointing::off;
  // Loss only (loss_sum / loss): 0 = head logits [T, vocab] then cross-entropy (fastest);
  // N > 0 = the head fused with the loss in vocabulary chunks of N rows (linear_cross_entropy),
  // never holding [T, vocab] logits — for large vocabularies or long rows (memory).
  int64_t loss_vocab_chunk = 0;
};

// Logits and loss of one forward pass.
struct CausalLMOutput {
  Tensor logits; // [T, vocab] f32 (f64 for an f64 model)
  Tensor loss;   // 0-dim: mean token cross-entropy over the valid targets (0 if none)
  int64_t num_targets = 0;
};

class Qwen3DecoderLayer : public nn::Module {
public:
  Qwen3DecoderLayer(const Qwen3Config& config, DType dtype);
  std::string type_name() const override { return "Qwen3DecoderLayer"; }

  // x: [T, H] -> [T, H]. stash: null, or this layer's selective-checkpointing stash.
  Tensor forward(const Tensor& x, const Tensor& cu_seqlens, const RopeTables& rope,
                 MatmulStash* stash = nullptr) const;

private:
  Tensor project(const nn::Linear& proj, const Tensor& x, MatmulStash* stash) const;

  int64_t heads_, kv_heads_, head_dim_;
  std::shared_ptr<nn::Linear> q_, k_, v_, o_, gate_, up_, down_;
  std::shared_ptr<nn::RMSNorm> q_norm_, k_norm_, in_norm_, post_norm_;
};

class Qwen3ForCausalLM : public nn::Module {
public:
  // Declares every parameter in `param_dtype` (f32, bf16 or f64); validates the config.
  explicit Qwen3ForCausalLM(const Qwen3Config& config, DType param_dtype = DType::f32);
  std::string type_name() const override { return "Qwen3ForCausalLM"; }

  const Qwen3Config& config() const { return config_; }
  DType param_dtype() const { return dtype_; }
  bool tied() const { return config_.tie_word_embeddings; }

  // HF initialisation (transformers' _init_weights): normal(0, initializer_range) for every
  // Linear and Embedding weight, biases 0, RMSNorm weights 1. Allocates the parameters first if
  // needed. Each parameter draws from its own stream keyed by its name (nn::Module::initialize).
  void init_weights(Rng& rng);

  // Final-norm hidden states [T, H] in the parameter dtype.
  Tensor hidden_states(const TextBatch& batch, const ForwardOptions& options = {}) const;
  // [T, vocab] f32 (f64 for an f64 model).
  Tensor logits(const TextBatch& batch, const ForwardOptions& options = {}) const;
  // Sum of token cross-entropies over targets != -100, 0-dim f32 (f64 for f64): the trainer
  // divides by the global number of targets for exact gradient accumulation.
  Tensor loss_sum(const TextBatch& batch, const ForwardOptions& options = {}) const;
  // Mean over valid targets; 0 (with zero gradients) when there is none.
  Tensor loss(const TextBatch& batch, const ForwardOptions& options = {}) const;
  // Logits and mean loss from one forward pass (`vlmtrain dump`).
  CausalLMOutput forward(const TextBatch& batch, const ForwardOptions& options = {}) const;

  // The head's weight: lm_head.weight, or model.embed_tokens.weight when tied (its gradient then
  // accumulates the contributions of both uses).
  const Tensor& lm_head_weight() const;
  const nn::Embedding& embed_tokens() const { return *embed_; }

private:
  void check_batch(const TextBatch& batch) const;
  // Head logits [T, vocab] in the parameter dtype.
  Tensor head_logits(const TextBatch& batch, const ForwardOptions& options) const;
  // Summed (or mean) token cross-entropy, chunked or not by options.loss_vocab_chunk.
  Tensor head_loss(const TextBatch& batch, const ForwardOptions& options, bool mean) const;

  Qwen3Config config_;
  DType dtype_;
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<nn::Linear> lm_head_; // null when tied
};

// What a parameter is, by its HF name, for optimizer groups (weight-decay exclusions):
//   norm       any RMSNorm weight (input/post-attention layernorm, q_norm, k_norm, model.norm)
//   bias       a projection bias (attention_bias)
//   embedding  model.embed_tokens.weight (also the head of a tied model)
//   weight     every other projection weight, including an untied lm_head.weight
enum class ParamKind : uint8_t { weight, norm, bias, embedding };
ParamKind qwen3_param_kind(const std::string& name);
// The usual rule: no weight decay on norms, biases and embeddings.
bool is_no_decay_param(const std::string& name);

} // namespace vlm::model
