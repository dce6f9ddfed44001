// The model contract (DESIGN.md §4.1): what every family (Qwen3, Qwen3-VL, Qwen3.5, ...) offers the
// trainer, `dump`, `export` and parallelism, so none of them names a family.
//
//   * hidden_states(batch) and head_weight(): lm_loss.h computes logits and the (chunked) loss
//     from these, written once for every family;
//   * blocks(): the repeated units (decoder layers; vision blocks for VLMs) in forward order —
//     what activation checkpointing and FSDP wrap from outside (parallel/), through
//     nn::Module::call and its hooks. A family runs each block through Module::call;
//   * param_role(name): the optimizer group of a parameter (llm / mlp / vit, for train_* and lr_*)
//     and its kind (weight decay applies to plain weights only, unless training.decay_* say so);
//   * hf_config(), training_flops(), summary(): what snapshots, metrics and logs need.
// The model knows nothing about parallelism: it calls no collective, and its layers derive head
// counts from their (possibly sharded) weight shapes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/batch.h"
#include "model/flops.h"
#include "model/stored_tensors.h"
#include "src/nn/module.h"

namespace vlm::model {

// The optimizer group of a parameter: the language model, the vision-language merger (VLMs,
// deepstack mergers included) or the vision tower.
enum class ParamGroup : uint8_t { llm, mlp, vit };
const char* param_group_name(ParamGroup g);

// What a parameter is, for weight decay:
//   norm       any norm weight
//   bias       any bias; Gated DeltaNet's A_log and dt_bias
//   embedding  token embeddings (also the head of a tied model), the vision position table
//   weight     every other weight, including an untied lm_head
enum class ParamKind : uint8_t { weight, norm, bias, embedding };

struct ParamRole {
  ParamGroup group = ParamGroup::llm;
  ParamKind kind = ParamKind::weight;
};

// The kind by the HF naming conventions every Qwen family follows: "...norm.weight" and
// "...normN.weight" (input / post-attention layernorm, q/k norms, the final norm, the vision
// blocks' norm1 / norm2), "....bias" (and "...dt_bias", "...A_log"), "...embed_tokens.weight" and
// the vision position table
// "...pos_embed.weight" (embeddings).
ParamKind param_kind_by_name(const std::string& name);

class CausalLM : public nn::Module {
public:
  // config.json's model_type ("qwen3"); the ModelSpec registry is keyed by it.
  virtual std::string model_type() const = 0;
  // Parameter and compute dtype (f32, bf16; f64 for finite-difference tests).
  virtual DType param_dtype() const = 0;
  // Rows of the LM head; token ids and targets must be below it.
  virtual int64_t vocab_size() const = 0;
  // Whether batches may carry pixel_values / image_grid_thw (a vision tower).
  virtual bool has_vision() const { return false; }
  // The longest sequence the model takes (config.json's max_position_embeddings); 0 = no limit
  // known. `generate` keeps prompt + new tokens within it.
  virtual int64_t max_positions() const { return 0; }

  // Final-norm hidden states [T, H] in the parameter dtype.
  virtual Tensor hidden_states(const Batch& batch) const = 0;
  // The LM head's weight [vocab, H]; the embedding matrix when tied (its gradient then
  // accumulates both uses).
  virtual const Tensor& head_weight() const = 0;
  // The repeated blocks in forward order (see above).
  virtual std::vector<nn::Module*> blocks() const = 0;
  // By full parameter name (as named_parameters() lists it).
  virtual ParamRole param_role(const std::string& name) const = 0;

  // The model's HF config.json (save_hf_snapshot sets its dtype fields).
  virtual nlohmann::json hf_config() const = 0;
  // Training FLOPs of one packed batch (model/flops.h): documents [cu_seqlens[d], cu_seqlens[d+1])
  // for d < num_real_docs (-1: all); the padding segments after them are left out. A VLM adds
  // its vision tower's for the row's images, (t, h, w) in patches (a text model has none).
  virtual TrainingFlops
  training_flops(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs = -1,
                 const std::vector<std::array<int64_t, 3>>& image_grids = {}) const = 0;
  // One line for logs: "Qwen3(H=64, L=2, ...)".
  virtual std::string summary() const = 0;

  // HF initialisation: allocates the parameters (if needed) and fills them by their rules, each
  // from its own stream keyed by its name (nn::Module::initialize).
  void init_weights(Rng& rng);

  // Name prefixes of the tensors a snapshot of this family may hold that the model carries
  // without computing with them (Qwen3.5: "mtp."); any other unknown tensor is an error.
  virtual std::vector<std::string> carried_prefixes() const { return {}; }
  // The stored dtypes and carried tensors of the checkpoint the weights came from (empty for
  // random weights): loaders fill it, checkpoints and snapshots write it.
  StoredTensors& stored() { return stored_; }
  const StoredTensors& stored() const { return stored_; }

private:
  StoredTensors stored_;
};

} // namespace vlm::model
