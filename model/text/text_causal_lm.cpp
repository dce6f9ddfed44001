#include "model/text/text_causal_lm.h"

namespace vlm::model {

TextCausalLM::TextCausalLM(DType param_dtype, const char* who) : dtype_(param_dtype), who_(who) {
  VLM_CHECK(param_dtype == DType::f32 || param_dtype == DType::bf16 || param_dtype == DType::f64,
            who, ": parameter dtype must be f32, bf16 or f64, got ", dtype_name(param_dtype));
}

const Tensor& TextCausalLM::head_weight() const {
  return lm_head_ ? lm_head_->weight() : text_->embed_tokens().weight();
}

void TextCausalLM::register_text(nn::Module& parent, const std::string& name, const TextConfig& c,
                                 bool zero_centered_norm,
                                 std::function<std::shared_ptr<TextBlock>(int64_t)> make_layer) {
  TextStackOptions o;
  o.vocab_size = c.vocab_size;
  o.hidden_size = c.hidden_size;
  o.num_layers = c.num_hidden_layers;
  o.initializer_range = c.initializer_range;
  o.final_norm.eps = c.rms_norm_eps;
  o.final_norm.zero_centered = zero_centered_norm;
  o.make_layer = std::move(make_layer);
  text_ = parent.register_module(name, std::make_shared<TextModel>(o, dtype_));
}

void TextCausalLM::register_head(const TextConfig& c) {
  if (c.tie_word_embeddings) return;
  nn::LinearOptions head_opts;
  head_opts.weight_init = nn::Init::normal(c.initializer_range);
  head_opts.dtype = dtype_;
  lm_head_ = register_module("lm_head",
                             std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, head_opts));
}

void TextCausalLM::check_text_batch(const Batch& b) const {
  VLM_CHECK(b.input_ids.defined() && b.input_ids.dim() == 1 && b.input_ids.numel() > 0, who_,
            ": input_ids must be a non-empty [T] tensor, got ",
            b.input_ids.defined() ? b.input_ids.desc() : std::string("nothing"));
  VLM_CHECK(!b.targets.defined() || b.targets.shape() == b.input_ids.shape(), who_,
            ": targets must be [T] like ", describe("input_ids", b.input_ids), ", got ",
            b.targets.defined() ? b.targets.desc() : std::string("nothing"));
  VLM_CHECK(b.cu_seqlens.defined(), who_, ": the batch has no cu_seqlens");
}

BlockContext TextCausalLM::block_context(const Batch& b, RopeTables rope) const {
  BlockContext ctx;
  ctx.varlen = VarlenLayout::of(b.cu_seqlens, b.input_ids.numel());
  ctx.rope = std::move(rope);
  return ctx;
}

} // namespace vlm::model
