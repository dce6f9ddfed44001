#include "model/qwen3_vl/model.h"

#include <cmath>
#include <vector>

#include "src/core/ops/elementwise.h"
#include "src/core/ops/index.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Host copies of small batch tensors (a device tensor is read back: one synchronization).
std::vector<int64_t> host_ints(const Tensor& t) {
  std::vector<int64_t> out;
  out.reserve(size_t(t.numel()));
  for (double v : t.to_doubles()) out.push_back(int64_t(v));
  return out;
}

} // namespace

Qwen3VLForConditionalGeneration::Qwen3VLForConditionalGeneration(const Qwen3VLConfig& config,
                                                                 DType param_dtype)
    : config_(config), dtype_(param_dtype) {
  config_.validate();
  VLM_CHECK(param_dtype == DType::f32 || param_dtype == DType::bf16 || param_dtype == DType::f64,
            "Qwen3VLForConditionalGeneration: parameter dtype must be f32, bf16 or f64, got ",
            dtype_name(param_dtype));
  const auto& c = config_;
  // Registration order = HF's state-dict order: the tower first.
  auto& model = *register_module("model", std::make_shared<nn::Module>());
  visual_ = model.register_module("visual", std::make_shared<VisionTower>(c.vision, dtype_));
  auto& lm = *model.register_module("language_model", std::make_shared<nn::Module>());
  embed_ = lm.register_module("embed_tokens", std::make_shared<nn::Embedding>(
                                                  c.vocab_size, c.hidden_size,
                                                  nn::Init::normal(c.initializer_range), dtype_));
  layers_ = lm.register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; i++)
    layers_->append(std::make_shared<Qwen3DecoderLayer>(c.decoder_layer(), dtype_));
  nn::RMSNormOptions norm_opts;
  norm_opts.eps = c.rms_norm_eps;
  norm_opts.dtype = dtype_;
  norm_ = lm.register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, norm_opts));
  if (!c.tie_word_embeddings) {
    nn::LinearOptions head_opts;
    head_opts.weight_init = nn::Init::normal(c.initializer_range);
    head_opts.dtype = dtype_;
    lm_head_ = register_module(
        "lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, head_opts));
  }
}

const Tensor& Qwen3VLForConditionalGeneration::head_weight() const {
  return lm_head_ ? lm_head_->weight() : embed_->weight();
}

std::vector<nn::Module*> Qwen3VLForConditionalGeneration::blocks() const {
  std::vector<nn::Module*> out = visual_->blocks();
  for (size_t i = 0; i < layers_->size(); i++) out.push_back(&(*layers_)[i]);
  return out;
}

ParamRole Qwen3VLForConditionalGeneration::param_role(const std::string& name) const {
  ParamGroup group = ParamGroup::llm;
  if (starts_with(name, "model.visual.merger.") ||
      starts_with(name, "model.visual.deepstack_merger_list."))
    group = ParamGroup::mlp;
  else if (starts_with(name, "model.visual."))
    group = ParamGroup::vit;
  return {group, param_kind_by_name(name)};
}

TrainingFlops Qwen3VLForConditionalGeneration::training_flops(
    const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs,
    const std::vector<std::array<int64_t, 3>>& image_grids) const {
  const auto& c = config_;
  const std::vector<int64_t> docs =
      document_lengths(cu_seqlens, num_real_docs, "Qwen3VL training_flops");
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  const int64_t matmul =
      c.num_hidden_layers * (H * q + 2 * H * kv + q * H + 3 * H * c.intermediate_size) +
      H * c.vocab_size;
  TrainingFlops f;
  for (int64_t s : docs) f.tokens += s;
  f.linear = 6.0 * double(matmul) * double(f.tokens);
  f.attention = 12.0 * double(q) * causal_pairs(docs) * double(c.num_hidden_layers);

  // The tower: per patch the patch embedding and the blocks; per merged token (m x m patches)
  // the merger and each DeepStack merger; attention over all pairs of one frame's patches.
  const VisionConfig& v = c.vision;
  const int64_t Hv = v.hidden_size, m2 = v.spatial_merge_size * v.spatial_merge_size;
  const double per_patch =
      double(v.patch_dim() * Hv + v.depth * (4 * Hv * Hv + 2 * Hv * v.intermediate_size));
  const double per_merged = double(int64_t(1 + v.deepstack_visual_indexes.size()) *
                                   (Hv * m2 * Hv * m2 + Hv * m2 * v.out_hidden_size));
  for (const auto& g : image_grids) { // attention runs per frame (t) of h x w patches
    const double frame = double(g[1] * g[2]), patches = double(g[0]) * frame;
    f.linear += 6.0 * (per_patch * patches + per_merged * patches / double(m2));
    f.attention += 12.0 * double(Hv) * double(g[0]) * frame * frame * double(v.depth);
  }
  return f;
}

void Qwen3VLForConditionalGeneration::check_batch(const Batch& b) const {
  VLM_CHECK(b.input_ids.defined() && b.input_ids.dim() == 1 && b.input_ids.numel() > 0,
            "Qwen3VL: input_ids must be a non-empty [T] tensor, got ",
            b.input_ids.defined() ? b.input_ids.desc() : std::string("nothing"));
  const int64_t T = b.input_ids.numel();
  VLM_CHECK(b.position_ids.defined() &&
                ((b.position_ids.dim() == 1 && b.position_ids.size(0) == T) ||
                 (b.position_ids.dim() == 2 && b.position_ids.size(0) == 3 &&
                  b.position_ids.size(1) == T)),
            "Qwen3VL: position_ids must be [3, T] (t, h, w) or [T] with T = ", T, ", got ",
            b.position_ids.defined() ? b.position_ids.desc() : std::string("nothing"));
  VLM_CHECK(!b.targets.defined() || b.targets.shape() == b.input_ids.shape(),
            "Qwen3VL: targets must be [T] like input_ids, got ", b.targets.desc());
  VLM_CHECK(b.cu_seqlens.defined(), "Qwen3VL: the batch has no cu_seqlens");
  VLM_CHECK(b.pixel_values.defined() == b.image_grid_thw.defined(),
            "Qwen3VL: pixel_values and image_grid_thw come together (got only ",
            b.pixel_values.defined() ? "pixel_values" : "image_grid_thw", ")");
  VLM_CHECK(!b.image_grid_thw.defined() ||
                (b.image_grid_thw.dim() == 2 && b.image_grid_thw.size(1) == 3),
            "Qwen3VL: image_grid_thw must be [images, 3], got ", b.image_grid_thw.desc());
}

Tensor Qwen3VLForConditionalGeneration::hidden_states(const Batch& b) const {
  check_batch(b);
  const auto& c = config_;
  const Device device = b.input_ids.device();

  // The image placeholder positions, in order.
  const std::vector<int64_t> ids = host_ints(b.input_ids);
  std::vector<int64_t> image_pos;
  std::vector<double> keep(ids.size(), 1.0);
  for (size_t t = 0; t < ids.size(); t++)
    if (ids[t] == c.image_token_id) image_pos.push_back(int64_t(t)), keep[t] = 0.0;

  std::vector<GridTHW> grids;
  if (b.image_grid_thw.defined()) {
    const std::vector<int64_t> g = host_ints(b.image_grid_thw);
    for (size_t i = 0; i + 2 < g.size(); i += 3) grids.push_back({g[i], g[i + 1], g[i + 2]});
  }
  Tensor x = embed_->forward(b.input_ids);
  VisionFeatures vision;
  if (!grids.empty()) {
    vision = visual_->forward(b.pixel_values, grids);
    VLM_CHECK(vision.embeds.size(0) == int64_t(image_pos.size()), "Qwen3VL: the batch has ",
              image_pos.size(), " <|image_pad|> tokens (id ", c.image_token_id, ") but its ",
              grids.size(), " images give ", vision.embeds.size(0), " image features");
    const Tensor pos = Tensor::from_vector(image_pos, {int64_t(image_pos.size())}, device);
    const Tensor keep_t = Tensor::from_doubles(keep, {int64_t(keep.size()), 1}, dtype_, device);
    x = index_add(mul(x, keep_t), 0, pos, vision.embeds);
  } else {
    VLM_CHECK(image_pos.empty(), "Qwen3VL: the batch has ", image_pos.size(),
              " <|image_pad|> tokens (id ", c.image_token_id, ") but no pixel_values");
  }
  if (grids.empty() && !b.kv_cache) { // decoding needs no vision gradients
    // The tower on one blank 2x2-patch image, scaled by 0 (see the header).
    const int64_t m = c.vision.spatial_merge_size;
    const Tensor blank = Tensor::zeros({m * m, c.vision.patch_dim()}, dtype_, device);
    const VisionFeatures unused = visual_->forward(blank, {GridTHW{1, m, m}});
    Tensor zero = sum(unused.embeds);
    for (const Tensor& f : unused.deepstack) zero = add(zero, sum(f));
    x = add(x, scale(zero, 0.0));
  }

  const RopeTables rope_t =
      b.position_ids.dim() == 2
          ? mrope_tables(b.position_ids, c.head_dim, c.rope_theta, c.mrope_section, dtype_)
          : rope_tables(b.position_ids, c.head_dim, c.rope_theta, dtype_);
  const Tensor pos = image_pos.empty()
                         ? Tensor()
                         : Tensor::from_vector(image_pos, {int64_t(image_pos.size())}, device);
  if (b.kv_cache) b.kv_cache->layers.resize(layers_->size());
  for (size_t i = 0; i < layers_->size(); i++) {
    const auto& layer = static_cast<const Qwen3DecoderLayer&>((*layers_)[i]);
    KVCache::Layer* cache = b.kv_cache ? &b.kv_cache->layers[i] : nullptr;
    // Captured by value: a wrapper (activation checkpointing) may run this again in backward.
    auto forward = [&layer, cu_seqlens = b.cu_seqlens, rope_t,
                    cache](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{layer.forward(in[0], cu_seqlens, rope_t, cache)};
    };
    x = layer.call(forward, {x})[0];
    if (i < vision.deepstack.size()) x = index_add(x, 0, pos, vision.deepstack[i]);
  }
  return norm_->forward(x);
}

} // namespace vlm::model
