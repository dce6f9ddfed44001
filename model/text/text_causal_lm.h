// What every family's CausalLM built on the shared text stack has in common: the parameter
// dtype, the text stack (model/text/text_model.h) and the LM head (lm_head.weight, or the
// embeddings when tied), the text batch checks and the per-batch block context; and FamilyLM,
// the members a family derives from its config alone. A family derives from
// FamilyLM<its config> (over TextCausalLM, or model/vision/vision_language_lm.h for a VLM),
// registers its modules in HF's order and adds what is its own (MRoPE, its layer kinds).
#pragma once

#include <memory>

#include "model/causal_lm.h"
#include "model/text/text_config.h"
#include "model/text/text_model.h"
#include "src/nn/linear.h"

namespace vlm::model {

class TextCausalLM : public CausalLM {
public:
  DType param_dtype() const override { return dtype_; }
  // lm_head.weight, or the embedding matrix when tied.
  const Tensor& head_weight() const override;
  const TextModel& text_model() const { return *text_; }

protected:
  // `who` names the model in errors; the dtype must be f32, bf16 or f64.
  TextCausalLM(DType param_dtype, const char* who);

  // Registers the text stack as `parent`'s child `name`.
  void register_text(nn::Module& parent, const std::string& name, const TextConfig& config,
                     bool zero_centered_norm,
                     std::function<std::shared_ptr<TextBlock>(int64_t)> make_layer);
  // Registers lm_head unless the config ties it to the embeddings.
  void register_head(const TextConfig& config);
  // input_ids [T] (non-empty), targets [T] when present, cu_seqlens present; `who` prefixes
  // every error.
  void check_text_batch(const Batch& batch) const;
  // The batch's documents and rope tables for every layer.
  BlockContext block_context(const Batch& batch, RopeTables rope) const;

  DType dtype_;
  const char* who_;
  std::shared_ptr<TextModel> text_;
  std::shared_ptr<nn::Linear> lm_head_; // null when tied
};

// The CausalLM members that come from a family's config (validated on construction): its
// vocabulary, longest sequence, config.json and summary.
template <typename Config, typename Base = TextCausalLM> class FamilyLM : public Base {
public:
  const Config& config() const { return config_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_positions() const override { return config_.max_position_embeddings; }
  nlohmann::json hf_config() const override { return config_.to_json(); }
  std::string summary() const override { return config_.summary(); }

protected:
  FamilyLM(const Config& config, DType param_dtype, const char* who)
      : Base(param_dtype, who), config_(config) {
    config_.validate();
  }

  Config config_;
};

} // namespace vlm::model
