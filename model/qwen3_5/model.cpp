#include "model/qwen3_5/model.h"

#include "model/text/decoder_layer.h"
#include "model/text/gated_deltanet.h"

namespace vlm::model {

Qwen3_5ForConditionalGeneration::Qwen3_5ForConditionalGeneration(const Qwen3_5Config& config,
                                                                 DType param_dtype)
    : FamilyLM(config, param_dtype, "Qwen3.5") {
  nn::Module& model = register_tower(config_.vision);
  const DecoderLayerConfig layer = config_.decoder_layer();
  const GatedDeltaNetConfig gdn = config_.gated_deltanet();
  register_text(model, "language_model", config_, /*zero_centered_norm=*/true,
                [this, layer, gdn](int64_t i) -> std::shared_ptr<TextBlock> {
                  if (!config_.is_linear_attention(i))
                    return std::make_shared<DecoderLayer>(layer, dtype_);
                  return std::make_shared<DecoderLayer>(
                      layer, "linear_attn", std::make_shared<GatedDeltaNet>(gdn, dtype_), dtype_);
                });
  register_head(config_);
}

TrainingFlops Qwen3_5ForConditionalGeneration::training_flops(
    const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs,
    const std::vector<std::array<int64_t, 3>>& image_grids) const {
  const auto& c = config_;
  const std::vector<int64_t> docs = document_lengths(cu_seqlens, num_real_docs, "Qwen3.5 flops");
  const GatedDeltaNetConfig g = c.gated_deltanet();
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, n_linear = c.num_linear_attention_layers(),
                n_full = c.num_hidden_layers - n_linear;
  const int64_t attention_gemms = 2 * H * q + 2 * H * kv + q * H;
  const int64_t gdn_gemms =
      H * (g.conv_dim() + g.value_dim() + 2 * g.num_value_heads) + g.value_dim() * H;
  const int64_t matmul = n_full * attention_gemms + n_linear * gdn_gemms +
                         c.num_hidden_layers * c.mlp_matmul_params() + H * c.vocab_size;
  TrainingFlops f;
  for (int64_t s : docs) f.tokens += s;
  f.linear = 6.0 * double(matmul) * double(f.tokens);
  f.attention = 12.0 * double(q) * causal_pairs(docs) * double(n_full) +
                18.0 * double(g.num_value_heads * g.key_head_dim * g.value_head_dim) *
                    double(f.tokens) * double(n_linear);
  add_vision_flops(f, c.vision, image_grids);
  return f;
}

Tensor Qwen3_5ForConditionalGeneration::hidden_states(const Batch& b) const {
  const auto& c = config_;
  const FusedEmbeddings fused = embed(b, c.image_token_id);
  const RopeTables rope_t =
      b.position_ids.dim() == 2
          ? mrope_tables(b.position_ids, c.rotary_dim(), c.rope_theta, c.mrope_section, dtype_)
          : rope_tables(b.position_ids, c.rotary_dim(), c.rope_theta, dtype_);
  return text_->forward(fused.embeds, block_context(b, rope_t), b.kv_cache);
}

} // namespace vlm::model
