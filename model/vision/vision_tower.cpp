#include "model/vision/vision_tower.h"

#include <algorithm>
#include <cmath>

#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/index.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

nn::LinearOptions linear_options(const VisionConfig& c, DType dtype) {
  nn::LinearOptions o;
  o.bias = true;
  o.weight_init = nn::Init::normal(c.initializer_range);
  o.dtype = dtype;
  return o;
}

nn::LayerNormOptions norm_options(const VisionConfig& c, DType dtype) {
  return {c.layer_norm_eps, dtype};
}

// rope() in fp32 (transformers upcasts q and k for the vision rotary), back to x's dtype.
Tensor rope_f32(const Tensor& x, const RopeTables& tables) {
  if (x.dtype() == DType::f32) return rope(x, tables);
  return cast(rope(cast(x, DType::f32), tables), x.dtype());
}

} // namespace

// --- block ---------------------------------------------------------------------------------------

VisionBlock::VisionBlock(const VisionConfig& c, DType dtype) : head_dim_(c.head_dim()) {
  const int64_t Hv = c.hidden_size;
  norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(Hv, norm_options(c, dtype)));
  norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(Hv, norm_options(c, dtype)));
  auto& attn = *register_module("attn", std::make_shared<nn::Module>());
  qkv_ = attn.register_module("qkv",
                              std::make_shared<nn::Linear>(Hv, 3 * Hv, linear_options(c, dtype)));
  proj_ =
      attn.register_module("proj", std::make_shared<nn::Linear>(Hv, Hv, linear_options(c, dtype)));
  auto& mlp = *register_module("mlp", std::make_shared<nn::Module>());
  fc1_ = mlp.register_module("linear_fc1", std::make_shared<nn::Linear>(Hv, c.intermediate_size,
                                                                        linear_options(c, dtype)));
  fc2_ = mlp.register_module("linear_fc2", std::make_shared<nn::Linear>(c.intermediate_size, Hv,
                                                                        linear_options(c, dtype)));
}

Tensor VisionBlock::forward(const Tensor& x, const Tensor& cu_seqlens,
                            const RopeTables& rope_t) const {
  const int64_t N = x.size(0);
  // Heads from the local qkv weight (tensor parallelism shards it by heads): rows are q, k, v,
  // each head-major.
  const int64_t heads = qkv_->weight().size(0) / (3 * head_dim_);
  Tensor qkv = reshape(qkv_->forward(norm1_->forward(x)), {N, 3, heads, head_dim_});
  Tensor q = rope_f32(copy(squeeze(slice(qkv, 1, 0, 1), 1)), rope_t);
  Tensor k = rope_f32(copy(squeeze(slice(qkv, 1, 1, 2), 1)), rope_t);
  Tensor v = copy(squeeze(slice(qkv, 1, 2, 3), 1));
  Tensor a = attention(q, k, v, cu_seqlens, /*causal=*/false, 1.0 / std::sqrt(double(head_dim_)));
  Tensor x1 = add(x, proj_->forward(reshape(a, {N, heads * head_dim_})));
  Tensor h = gelu(fc1_->forward(norm2_->forward(x1)), GeluApprox::tanh);
  return add(x1, fc2_->forward(h));
}

// --- merger --------------------------------------------------------------------------------------

VisionPatchMerger::VisionPatchMerger(const VisionConfig& c, bool post_shuffle_norm, DType dtype)
    : merged_dim_(c.hidden_size * c.spatial_merge_size * c.spatial_merge_size),
      post_shuffle_norm_(post_shuffle_norm) {
  norm_ = register_module(
      "norm", std::make_shared<nn::LayerNorm>(post_shuffle_norm ? merged_dim_ : c.hidden_size,
                                              norm_options(c, dtype)));
  fc1_ = register_module("linear_fc1", std::make_shared<nn::Linear>(merged_dim_, merged_dim_,
                                                                    linear_options(c, dtype)));
  fc2_ = register_module("linear_fc2", std::make_shared<nn::Linear>(merged_dim_, c.out_hidden_size,
                                                                    linear_options(c, dtype)));
}

Tensor VisionPatchMerger::forward(const Tensor& x) const {
  VLM_CHECK(x.dim() == 2 && (x.size(0) * x.size(1)) % merged_dim_ == 0,
            "VisionPatchMerger: expected [N, Hv] with N a multiple of the merge window, got ",
            x.desc());
  // The patches of one 2x2 window are consecutive rows: a reshape concatenates them.
  Tensor h = post_shuffle_norm_ ? norm_->forward(reshape(x, {-1, merged_dim_}))
                                : reshape(norm_->forward(x), {-1, merged_dim_});
  return fc2_->forward(gelu(fc1_->forward(h), GeluApprox::none));
}

// --- tower ---------------------------------------------------------------------------------------

VisionTower::VisionTower(const VisionConfig& config, DType dtype) : config_(config), dtype_(dtype) {
  config_.validate();
  const VisionConfig& c = config_;
  auto& patch_embed = *register_module("patch_embed", std::make_shared<nn::Module>());
  patch_proj_ = patch_embed.register_module("proj", std::make_shared<nn::Module>());
  // The Conv3d's kernel in its HF shape [Hv, C, tp, p, p]; its (c, t, y, x) flattening is the
  // order of a pixel row, so the convolution is one GEMM.
  patch_proj_->declare_parameter(
      "weight", {c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size},
      nn::Init::normal(c.initializer_range), dtype);
  patch_proj_->declare_parameter("bias", {c.hidden_size}, nn::Init::zeros(), dtype);
  pos_embed_ = register_module(
      "pos_embed", std::make_shared<nn::Embedding>(c.num_position_embeddings, c.hidden_size,
                                                   nn::Init::normal(c.initializer_range), dtype));
  blocks_ = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.depth; i++) blocks_->append(std::make_shared<VisionBlock>(c, dtype));
  merger_ = register_module("merger", std::make_shared<VisionPatchMerger>(c, false, dtype));
  deepstack_mergers_ = register_module("deepstack_merger_list", std::make_shared<nn::ModuleList>());
  for (size_t k = 0; k < c.deepstack_visual_indexes.size(); k++)
    deepstack_mergers_->append(std::make_shared<VisionPatchMerger>(c, true, dtype));
}

std::vector<nn::Module*> VisionTower::blocks() const {
  std::vector<nn::Module*> out;
  for (size_t i = 0; i < blocks_->size(); i++) out.push_back(&(*blocks_)[i]);
  return out;
}

VisionFeatures VisionTower::forward(const Tensor& pixel_values,
                                    const std::vector<GridTHW>& grids) const {
  const VisionConfig& c = config_;
  const VisionPositions pos = vision_positions(grids, c.table_side(), c.spatial_merge_size);
  VLM_CHECK(pixel_values.defined() && pixel_values.dim() == 2 &&
                pixel_values.size(0) == pos.patches && pixel_values.size(1) == c.patch_dim(),
            "VisionTower: pixel_values must be [", pos.patches, ", ", c.patch_dim(),
            "] (the patches of image_grid_thw, channels x temporal patch x patch^2), got ",
            pixel_values.defined() ? pixel_values.desc() : std::string("nothing"));
  const Device device = pixel_values.device();
  const int64_t N = pos.patches, Hv = c.hidden_size;

  // Patch embedding, then the interpolated position table: 4 rows per patch weighted in fp32.
  Tensor x =
      linear(cast(pixel_values, dtype_), reshape(patch_proj_->param("weight"), {Hv, c.patch_dim()}),
             patch_proj_->param("bias"));
  const Tensor taps = Tensor::from_vector(pos.taps, {N * 4}, device);
  const Tensor weights = Tensor::from_vector(pos.weights, {N, 4, 1}, device);
  Tensor rows = reshape(pos_embed_->forward(taps), {N, 4, Hv});
  if (rows.dtype() != DType::f32 && rows.dtype() != DType::f64) rows = cast(rows, DType::f32);
  Tensor pe = sum(mul(rows, cast(weights, rows.dtype())), {1});
  x = add(x, cast(pe, dtype_));

  const RopeTables rope_t = vision_rope_tables(pos, c.head_dim(), c.rope_theta, device);
  const Tensor cu_seqlens =
      Tensor::from_vector(pos.cu_seqlens, {int64_t(pos.cu_seqlens.size())}, Device::cpu());
  VisionFeatures out;
  for (size_t j = 0; j < blocks_->size(); j++) {
    const auto& block = static_cast<const VisionBlock&>((*blocks_)[j]);
    // Captured by value: a wrapper (activation checkpointing) may run this again in backward.
    auto forward = [&block, cu_seqlens, rope_t](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{block.forward(in[0], cu_seqlens, rope_t)};
    };
    x = block.call(forward, {x})[0];
    const auto& idx = c.deepstack_visual_indexes;
    auto it = std::find(idx.begin(), idx.end(), int64_t(j));
    if (it != idx.end())
      out.deepstack.push_back(
          static_cast<const VisionPatchMerger&>((*deepstack_mergers_)[size_t(it - idx.begin())])
              .forward(x));
  }
  out.embeds = merger_->forward(x);
  return out;
}

} // namespace vlm::model
