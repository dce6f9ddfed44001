// Qwen3.5 dense (qwen-models.md §3) with transformers' parameter names
// (Qwen3_5ForConditionalGeneration): model.visual.* (model/vision/, no DeepStack),
// model.language_model.{embed_tokens, layers.N.*, norm}.weight and lm_head.weight when untied.
// Layer N is a Gated DeltaNet layer (linear_attn.*, model/text/gated_deltanet.h) or a gated
// full-attention layer (self_attn.*, q_proj making query and gate per head) as layer_types says;
// every norm of the text stack is zero-centred ((1 + w) ⊙ x̂).
//
// Forward of a packed batch (model/batch.h): the vision tower and the fusion of its features at
// the <|image_pad|> tokens as Qwen3-VL (model/vision/vision_language.h); interleaved MRoPE from
// [3, T] position ids over the first head_dim · partial_rotary_factor dims of each attention head
// ([T] ids: text positions); every layer keeps documents apart — attention causal within each
// document, the conv1d history and the delta-rule state reset at each document start.
#pragma once

#include <string>
#include <vector>

#include "model/qwen3_5/config.h"
#include "model/vision/vision_language_lm.h"

namespace vlm::model {

class Qwen3_5ForConditionalGeneration : public FamilyLM<Qwen3_5Config, VisionLanguageLM> {
public:
  explicit Qwen3_5ForConditionalGeneration(const Qwen3_5Config& config,
                                           DType param_dtype = DType::f32);
  std::string type_name() const override { return "Qwen3_5ForConditionalGeneration"; }
  std::string model_type() const override { return "qwen3_5"; }
  Tensor hidden_states(const Batch& batch) const override;
  // qwen-models.md §7: the GEMMs (gated q_proj, Gated DeltaNet projections), causal attention of
  // the full-attention layers, the delta rule's minimal count 18 · HV · dk · dv per token and
  // Gated DeltaNet layer, and the vision tower for `image_grids`.
  TrainingFlops
  training_flops(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs = -1,
                 const std::vector<std::array<int64_t, 3>>& image_grids = {}) const override;
  // The multi-token-prediction module (§3.10) is carried through unchanged, not trained.
  std::vector<std::string> carried_prefixes() const override { return {"mtp."}; }
};

} // namespace vlm::model
