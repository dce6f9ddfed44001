#include "model/qwen3/model.h"

#include "model/text/decoder_layer.h"
#include "model/text/text_flops.h"

namespace vlm::model {

Qwen3ForCausalLM::Qwen3ForCausalLM(const Qwen3Config& config, DType param_dtype)
    : FamilyLM(config, param_dtype, "Qwen3ForCausalLM") {
  const DecoderLayerConfig layer = config_.decoder_layer();
  register_text(*this, "model", config_, /*zero_centered_norm=*/false,
                [this, layer](int64_t) { return std::make_shared<DecoderLayer>(layer, dtype_); });
  register_head(config_);
}

std::vector<nn::Module*> Qwen3ForCausalLM::blocks() const { return text_->layers(); }

ParamRole Qwen3ForCausalLM::param_role(const std::string& name) const {
  return {ParamGroup::llm, param_kind_by_name(name)};
}

TrainingFlops Qwen3ForCausalLM::training_flops(const std::vector<int32_t>& cu_seqlens,
                                               int64_t num_real_docs,
                                               const std::vector<std::array<int64_t, 3>>&) const {
  return dense_text_training_flops(config_, cu_seqlens, num_real_docs);
}

Tensor Qwen3ForCausalLM::hidden_states(const Batch& b) const {
  check_text_batch(b);
  VLM_CHECK(b.position_ids.defined() && b.position_ids.shape() == b.input_ids.shape(),
            "Qwen3ForCausalLM: position_ids must be [T] like ", describe("input_ids", b.input_ids),
            ", got ", b.position_ids.defined() ? b.position_ids.desc() : std::string("nothing"));
  VLM_CHECK(!b.pixel_values.defined(), "Qwen3ForCausalLM: a text model takes no pixel_values (",
            b.pixel_values.desc(), ")");
  const BlockContext ctx =
      block_context(b, rope_tables(b.position_ids, config_.head_dim, config_.rope_theta, dtype_));
  return text_->forward(text_->embed(b.input_ids), ctx, b.kv_cache);
}

} // namespace vlm::model
