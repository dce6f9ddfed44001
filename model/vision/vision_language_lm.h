// The CausalLM base of the vision-language families (Qwen3-VL, Qwen3.5): the text stack of
// model/text/ plus the vision tower at model.visual (registered first, as in HF's state dict),
// the image features fused into the token embeddings (model/vision/vision_language.h), the
// blocks in forward order (the tower's, then the decoder layers) and the optimizer groups
// (model.visual.merger.* and model.visual.deepstack_merger_list.* "mlp", every other
// model.visual.* parameter, the position table included, "vit", the rest "llm").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/text/text_causal_lm.h"
#include "model/vision/vision_language.h"
#include "model/vision/vision_tower.h"

namespace vlm::model {

class VisionLanguageLM : public TextCausalLM {
public:
  const VisionTower& visual() const { return *visual_; }
  bool has_vision() const override { return true; }
  std::vector<nn::Module*> blocks() const override;
  ParamRole param_role(const std::string& name) const override;

protected:
  VisionLanguageLM(DType param_dtype, const char* who) : TextCausalLM(param_dtype, who) {}

  // Registers "model" with the tower as its first child; returns "model", where the family
  // registers its text stack ("language_model").
  nn::Module& register_tower(const VisionConfig& vision);
  // The batch checked (text and vision inputs) and its token embeddings with the images fused.
  FusedEmbeddings embed(const Batch& batch, int64_t image_token_id) const;

  std::shared_ptr<VisionTower> visual_;
};

} // namespace vlm::model
