#include "model/qwen3.h"

#include <cmath>
#include <vector>

#include "model/selective_ac.h"
#include "src/core/autograd.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/loss.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

// [T] or [1, T] -> [T]; `what` names the tensor in errors.
Tensor as_tokens(const Tensor& t, const char* what) {
  VLM_CHECK(t.defined(), "text batch: ", what, " is missing");
  VLM_CHECK(t.dim() == 1 || (t.dim() == 2 && t.size(0) == 1), "text batch: ", what,
            " must be [T] or [1, T], got ", t.desc());
  VLM_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, "text batch: ", what,
            " must be i32 or i64, got ", t.desc());
  return reshape(t, {t.numel()});
}

} // namespace

TextBatch text_batch_from_labels(const Tensor& input_ids, const Tensor& labels,
                                 const Tensor& position_ids, const Tensor& cu_seqlens) {
  NoGradGuard no_grad;
  TextBatch b;
  b.input_ids = as_tokens(input_ids, "input_ids").to(DType::i64).contiguous();
  Tensor lab = as_tokens(labels, "labels").to(DType::i64).contiguous();
  b.position_ids = as_tokens(position_ids, "position_ids").to(DType::i64).contiguous();
  const int64_t T = b.input_ids.numel();
  VLM_CHECK(T > 0, "text batch: input_ids is empty");
  VLM_CHECK(lab.numel() == T && b.position_ids.numel() == T, "text batch: input_ids has ", T,
            " tokens but labels ", labels.desc(), " and position_ids ", position_ids.desc());
  std::vector<int64_t> targets(size_t(T), -100);
  const int64_t* l = lab.data<int64_t>();
  for (int64_t t = 0; t + 1 < T; t++) targets[size_t(t)] = l[t + 1];
  b.targets = Tensor::from_vector(targets, {T});
  VLM_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 &&
                (cu_seqlens.dtype() == DType::i32 || cu_seqlens.dtype() == DType::i64),
            "text batch: cu_seqlens must be [docs + 1] i32 or i64, got ",
            cu_seqlens.defined() ? cu_seqlens.desc() : std::string("nothing"));
  b.cu_seqlens = cu_seqlens.to(DType::i32).contiguous();
  return b;
}

int64_t count_targets(const TextBatch& batch) {
  if (batch.num_targets >= 0) return batch.num_targets;
  int64_t n = 0;
  for (double v : batch.targets.to_doubles()) n += v != -100;
  return n;
}

TextBatch to_device(const TextBatch& b, Device device) {
  NoGradGuard no_grad;
  TextBatch out;
  out.num_targets = b.targets.defined() ? count_targets(b) : 0;
  out.cu_seqlens = b.cu_seqlens.to(Device::cpu());
  const int64_t T = b.input_ids.numel();
  if (device.is_cpu()) {
    auto ids = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::i64); };
    out.input_ids = ids(b.input_ids);
    out.targets = b.targets.defined() ? ids(b.targets) : Tensor();
    out.position_ids = ids(b.position_ids);
    return out;
  }
  // Rows of one i64 staging tensor: ids, positions, targets (when present).
  const bool has_targets = b.targets.defined();
  Tensor staging = Tensor::empty_pinned({has_targets ? 3 : 2, T}, DType::i64);
  const Tensor* rows[] = {&b.input_ids, &b.position_ids, &b.targets};
  for (int64_t r = 0; r < staging.size(0); r++) {
    VLM_CHECK(rows[r]->numel() == T, "to_device: the batch's tensors differ in length: ",
              describe("input_ids", b.input_ids), ", ", rows[r]->desc());
    Tensor dst = reshape(slice(staging, 0, r, r + 1), {T});
    copy_(dst, reshape(rows[r]->to(Device::cpu()), {T}).to(DType::i64));
  }
  Tensor on_device = staging.to(device);
  auto row = [&](int64_t r) { return reshape(slice(on_device, 0, r, r + 1), {T}); };
  out.input_ids = row(0);
  out.position_ids = row(1);
  if (has_targets) out.targets = row(2);
  return out;
}

const char* activation_checkpointing_name(ActivationCheckpointing ac) {
  switch (ac) {
  case ActivationCheckpointing::off: return "off";
  case ActivationCheckpointing::full: return "full";
  case ActivationCheckpointing::selective: return "selective";
  }
  return "?";
}

ActivationCheckpointing parse_activation_checkpointing(const std::string& name) {
  if (name == "off") return ActivationCheckpointing::off;
  if (name == "full") return ActivationCheckpointing::full;
  if (name == "selective" || name == "sac") return ActivationCheckpointing::selective;
  VLM_FAIL("unknown activation checkpointing mode '", name,
           "' (valid: off, full, selective; 'sac' = selective)");
}

// --- decoder layer -------------------------------------------------------------------------------

Qwen3DecoderLayer::Qwen3DecoderLayer(const Qwen3Config& c, DType dtype)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  nn::LinearOptions attn_opts;
  attn_opts.bias = c.attention_bias;
  attn_opts.weight_init = nn::Init::normal(c.initializer_range);
  attn_opts.dtype = dtype;
  nn::LinearOptions mlp_opts = attn_opts;
  mlp_opts.bias = false;
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.dtype = dtype;
  const int64_t H = c.hidden_size, q_dim = heads_ * head_dim_, kv_dim = kv_heads_ * head_dim_;

  // Registration order = HF's state-dict order.
  auto& attn = *register_module("self_attn", std::make_shared<nn::Module>());
  q_ = attn.register_module("q_proj", std::make_shared<nn::Linear>(H, q_dim, attn_opts));
  k_ = attn.register_module("k_proj", std::make_shared<nn::Linear>(H, kv_dim, attn_opts));
  v_ = attn.register_module("v_proj", std::make_shared<nn::Linear>(H, kv_dim, attn_opts));
  o_ = attn.register_module("o_proj", std::make_shared<nn::Linear>(q_dim, H, attn_opts));
  q_norm_ = attn.register_module("q_norm", std::make_shared<nn::RMSNorm>(head_dim_, norm_opts));
  k_norm_ = attn.register_module("k_norm", std::make_shared<nn::RMSNorm>(head_dim_, norm_opts));
  auto& mlp = *register_module("mlp", std::make_shared<nn::Module>());
  gate_ = mlp.register_module("gate_proj",
                              std::make_shared<nn::Linear>(H, c.intermediate_size, mlp_opts));
  up_ = mlp.register_module("up_proj",
                            std::make_shared<nn::Linear>(H, c.intermediate_size, mlp_opts));
  down_ = mlp.register_module("down_proj",
                              std::make_shared<nn::Linear>(c.intermediate_size, H, mlp_opts));
  in_norm_ = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(H, norm_opts));
  post_norm_ =
      register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(H, norm_opts));
}

Tensor Qwen3DecoderLayer::project(const nn::Linear& proj, const Tensor& x,
                                  MatmulStash* stash) const {
  return stash ? stash->linear(x, proj.weight(), proj.bias()) : proj.forward(x);
}

Tensor Qwen3DecoderLayer::forward(const Tensor& x, const Tensor& cu_seqlens,
                                  const RopeTables& rope_t, MatmulStash* stash) const {
  const int64_t T = x.size(0);
  // Attention: q/k RMSNorm per head (over D) before RoPE; GQA inside the attention op.
  Tensor h = in_norm_->forward(x);
  Tensor q = q_norm_->forward(reshape(project(*q_, h, stash), {T, heads_, head_dim_}));
  Tensor k = k_norm_->forward(reshape(project(*k_, h, stash), {T, kv_heads_, head_dim_}));
  Tensor v = reshape(project(*v_, h, stash), {T, kv_heads_, head_dim_});
  q = rope(q, rope_t);
  k = rope(k, rope_t);
  Tensor a = attention(q, k, v, cu_seqlens, /*causal=*/true, 1.0 / std::sqrt(double(head_dim_)));
  Tensor x1 = add(x, project(*o_, reshape(a, {T, heads_ * head_dim_}), stash));
  // MLP: down(silu(gate(h)) * up(h)).
  Tensor h2 = post_norm_->forward(x1);
  Tensor gu = swiglu(project(*gate_, h2, stash), project(*up_, h2, stash));
  return add(x1, project(*down_, gu, stash));
}

// --- causal LM -----------------------------------------------------------------------------------

Qwen3ForCausalLM::Qwen3ForCausalLM(const Qwen3Config& config, DType param_dtype)
    : config_(config), dtype_(param_dtype) {
  config_.validate();
  VLM_CHECK(param_dtype == DType::f32 || param_dtype == DType::bf16 || param_dtype == DType::f64,
            "Qwen3ForCausalLM: parameter dtype must be f32, bf16 or f64, got ",
            dtype_name(param_dtype));
  const auto& c = config_;
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.dtype = dtype_;
  auto& model = *register_module("model", std::make_shared<nn::Module>());
  embed_ = model.register_module(
      "embed_tokens",
      std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size,
                                      nn::Init::normal(c.initializer_range), dtype_));
  layers_ = model.register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; i++)
    layers_->append(std::make_shared<Qwen3DecoderLayer>(c, dtype_));
  norm_ = model.register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, norm_opts));
  if (!c.tie_word_embeddings) {
    nn::LinearOptions head_opts;
    head_opts.weight_init = nn::Init::normal(c.initializer_range);
    head_opts.dtype = dtype_;
    lm_head_ = register_module(
        "lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, head_opts));
  }
}

void Qwen3ForCausalLM::init_weights(Rng& rng) {
  materialize(); // no-op for parameters already allocated
  initialize(rng);
}

const Tensor& Qwen3ForCausalLM::lm_head_weight() const {
  return lm_head_ ? lm_head_->weight() : embed_->weight();
}

void Qwen3ForCausalLM::check_batch(const TextBatch& b) const {
  VLM_CHECK(b.input_ids.defined() && b.input_ids.dim() == 1 && b.input_ids.numel() > 0,
            "Qwen3ForCausalLM: input_ids must be a non-empty [T] tensor, got ",
            b.input_ids.defined() ? b.input_ids.desc() : std::string("nothing"));
  const Shape& s = b.input_ids.shape();
  VLM_CHECK(b.position_ids.defined() && b.position_ids.shape() == s,
            "Qwen3ForCausalLM: position_ids must be [T] like ", describe("input_ids", b.input_ids),
            ", got ", b.position_ids.defined() ? b.position_ids.desc() : std::string("nothing"));
  VLM_CHECK(!b.targets.defined() || b.targets.shape() == s, "Qwen3ForCausalLM: targets must be [T]",
            " like ", describe("input_ids", b.input_ids), ", got ",
            b.targets.defined() ? b.targets.desc() : std::string("nothing"));
  VLM_CHECK(b.cu_seqlens.defined(), "Qwen3ForCausalLM: the batch has no cu_seqlens");
}

Tensor Qwen3ForCausalLM::hidden_states(const TextBatch& b, const ForwardOptions& options) const {
  check_batch(b);
  const RopeTables rope_t =
      rope_tables(b.position_ids, config_.head_dim, config_.rope_theta, dtype_);
  Tensor x = embed_->forward(b.input_ids);
  const bool ckpt = options.ac != ActivationCheckpointing::off && GradMode::is_enabled();
  for (size_t i = 0; i < layers_->size(); i++) {
    const auto& layer = layers_->at<Qwen3DecoderLayer>(i);
    if (!ckpt) {
      x = layer.forward(x, b.cu_seqlens, rope_t);
      continue;
    }
    // The function runs again in backward, after this call returned: capture by value (the
    // layer is owned by the model, which must outlive the backward pass).
    std::shared_ptr<MatmulStash> stash;
    if (options.ac == ActivationCheckpointing::selective) stash = std::make_shared<MatmulStash>();
    auto fn = [&layer, cu_seqlens = b.cu_seqlens, rope_t, stash](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{layer.forward(in[0], cu_seqlens, rope_t, stash.get())};
    };
    x = checkpoint(fn, {x})[0];
  }
  return norm_->forward(x);
}

Tensor Qwen3ForCausalLM::head_logits(const TextBatch& b, const ForwardOptions& options) const {
  return vlm::linear(hidden_states(b, options), lm_head_weight());
}

namespace {

// Logits are handed out in fp32 (f64 for an f64 model), as HF upcasts them for the loss.
Tensor to_output_dtype(const Tensor& logits) {
  return logits.dtype() == DType::bf16 ? cast(logits, DType::f32) : logits;
}

} // namespace

Tensor Qwen3ForCausalLM::logits(const TextBatch& b, const ForwardOptions& options) const {
  return to_output_dtype(head_logits(b, options));
}

// The cross-entropy op reads bf16 logits and computes in fp32 — the same numbers as HF's
// logits.float() followed by the loss, without an fp32 copy of the [T, vocab] logits.
Tensor Qwen3ForCausalLM::head_loss(const TextBatch& b, const ForwardOptions& options,
                                   bool mean) const {
  VLM_CHECK(b.targets.defined(), "Qwen3ForCausalLM: the batch has no targets for the loss");
  VLM_CHECK(options.loss_vocab_chunk >= 0, "Qwen3ForCausalLM: loss_vocab_chunk must be >= 0, got ",
            options.loss_vocab_chunk);
  const Reduction r = mean ? Reduction::mean : Reduction::sum;
  if (options.loss_vocab_chunk > 0)
    return linear_cross_entropy(hidden_states(b, options), lm_head_weight(), b.targets, -100, r,
                                options.loss_vocab_chunk);
  return cross_entropy(head_logits(b, options), b.targets, -100, r);
}

Tensor Qwen3ForCausalLM::loss_sum(const TextBatch& b, const ForwardOptions& options) const {
  return head_loss(b, options, /*mean=*/false);
}

Tensor Qwen3ForCausalLM::loss(const TextBatch& b, const ForwardOptions& options) const {
  return head_loss(b, options, /*mean=*/true);
}

CausalLMOutput Qwen3ForCausalLM::forward(const TextBatch& b, const ForwardOptions& options) const {
  VLM_CHECK(b.targets.defined(), "Qwen3ForCausalLM::forward: the batch has no targets");
  Tensor head = head_logits(b, options);
  CausalLMOutput out;
  out.logits = to_output_dtype(head);
  out.loss = cross_entropy(head, b.targets);
  out.num_targets = count_targets(b);
  return out;
}

// --- parameter groups ----------------------------------------------------------------------------

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

ParamKind qwen3_param_kind(const std::string& name) {
  if (ends_with(name, "norm.weight")) return ParamKind::norm; // *_layernorm, q/k_norm, model.norm
  if (ends_with(name, ".bias")) return ParamKind::bias;
  if (ends_with(name, "embed_tokens.weight")) return ParamKind::embedding;
  return ParamKind::weight;
}

bool is_no_decay_param(const std::string& name) {
  return qwen3_param_kind(name) != ParamKind::weight;
}

} // namespace vlm::model
