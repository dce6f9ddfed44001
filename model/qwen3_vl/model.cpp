#include "model/qwen3_vl/model.h"

#include "model/text/decoder_layer.h"
#include "model/text/text_flops.h"
#include "src/core/ops/index.h"

namespace vlm::model {

Qwen3VLForConditionalGeneration::Qwen3VLForConditionalGeneration(const Qwen3VLConfig& config,
                                                                 DType param_dtype)
    : FamilyLM(config, param_dtype, "Qwen3VL") {
  nn::Module& model = register_tower(config_.vision);
  const DecoderLayerConfig layer = config_.decoder_layer();
  register_text(model, "language_model", config_, /*zero_centered_norm=*/false,
                [this, layer](int64_t) { return std::make_shared<DecoderLayer>(layer, dtype_); });
  register_head(config_);
}

TrainingFlops Qwen3VLForConditionalGeneration::training_flops(
    const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs,
    const std::vector<std::array<int64_t, 3>>& image_grids) const {
  TrainingFlops f = dense_text_training_flops(config_, cu_seqlens, num_real_docs);
  add_vision_flops(f, config_.vision, image_grids);
  return f;
}

Tensor Qwen3VLForConditionalGeneration::hidden_states(const Batch& b) const {
  check_text_batch(b);
  check_vision_batch(b, "Qwen3VL");
  const auto& c = config_;
  FusedEmbeddings fused = fuse_image_features(*visual_, text_->embed(b.input_ids), b,
                                              c.image_token_id, dtype_, "Qwen3VL");
  const RopeTables rope_t =
      b.position_ids.dim() == 2
          ? mrope_tables(b.position_ids, c.head_dim, c.rope_theta, c.mrope_section, dtype_)
          : rope_tables(b.position_ids, c.head_dim, c.rope_theta, dtype_);
  // After layer k the k-th DeepStack feature is added at the image positions: as rows of the
  // whole sequence (zeros elsewhere), which sequence parallelism splits like the residual stream.
  std::vector<Tensor> deepstack;
  for (const Tensor& features : fused.deepstack) {
    const Tensor& e = fused.embeds;
    deepstack.push_back(index_add(Tensor::zeros(e.shape(), e.dtype(), e.device()), 0,
                                  fused.image_positions, features));
  }
  return text_->forward(fused.embeds, block_context(b, rope_t), b.kv_cache, deepstack);
}

} // namespace vlm::model
