// Qwen3-VL dense (qwen-models.md §2) with transformers' parameter names
// (Qwen3VLForConditionalGeneration): model.visual.* (model/vision/vision_tower.h),
// model.language_model.{embed_tokens, layers.N.*, norm}.weight — the Qwen3 decoder layer of
// model/text/ — and lm_head.weight only when untied.
//
// Forward of a packed batch (model/batch.h):
//   1. the vision tower runs on all images of the batch (pixel_values, image_grid_thw in order);
//   2. token embeddings; the rows at <|image_pad|> are replaced, in order, by the merged image
//      features (a mask multiply and a scatter-add, so the placeholder's embedding row gets no
//      gradient, as with transformers' masked_scatter); their count must match;
//   3. the decoder layers with interleaved MRoPE from [3, T] position ids (restarting per
//      document; [T] ids mean text-only positions), causal within each document; after layer k
//      the k-th DeepStack feature is added at the image positions;
//   4. the final RMSNorm; the head and the loss are model/lm_loss.h's.
// A batch without images still runs the tower (model/vision/vision_language.h:
// fuse_image_features).
#pragma once

#include <string>
#include <vector>

#include "model/qwen3_vl/config.h"
#include "model/vision/vision_language_lm.h"

namespace vlm::model {

class Qwen3VLForConditionalGeneration : public FamilyLM<Qwen3VLConfig, VisionLanguageLM> {
public:
  explicit Qwen3VLForConditionalGeneration(const Qwen3VLConfig& config,
                                           DType param_dtype = DType::f32);
  std::string type_name() const override { return "Qwen3VLForConditionalGeneration"; }
  std::string model_type() const override { return "qwen3_vl"; }
  Tensor hidden_states(const Batch& batch) const override;
  // The text stack's FLOPs plus the vision tower's for `image_grids` (patch embedding, blocks
  // with attention over each image's patches, the merger and the DeepStack mergers).
  TrainingFlops
  training_flops(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs = -1,
                 const std::vector<std::array<int64_t, 3>>& image_grids = {}) const override;
};

} // namespace vlm::model
