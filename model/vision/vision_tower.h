// The Qwen3-VL vision tower (qwen-models.md §2.4), also Qwen3.5's (without DeepStack), with
// transformers' parameter names under its module (model.visual.): patch_embed.proj, pos_embed,
// blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.linear_fc1, mlp.linear_fc2}, merger.{norm,
// linear_fc1, linear_fc2}, deepstack_merger_list.K.{norm, linear_fc1, linear_fc2}.
//
//   pixels [N, C·tp·p²] -> patch embed (the Conv3d as one GEMM, bias) + the learned position
//   table bilinearly interpolated to each grid -> blocks (LayerNorm, bidirectional attention per
//   image with the 2-D rotary, GELU-tanh MLP) -> merger: LayerNorm, 4 patches (one 2x2 window)
//   concatenated, fc1, erf-GELU, fc2 -> [N/4, out], one row per LLM image token.
//   DeepStack: the outputs of blocks deepstack_visual_indexes[k] go through merger k, which
//   normalizes after the concatenation, giving [N/4, out] features for the LLM's first layers.
//
// Activations are in the parameter dtype; the rotary is applied in fp32 and the position table
// rows are weighted and summed in fp32, as transformers does. The blocks are the repeated units
// (activation checkpointing and FSDP wrap them from outside), each run through Module::call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/vision/vision_config.h"
#include "model/vision/vision_positions.h"
#include "src/nn/embedding.h"
#include "src/nn/layer_norm.h"
#include "src/nn/linear.h"

namespace vlm::model {

class VisionBlock : public nn::Module {
public:
  VisionBlock(const VisionConfig& config, DType dtype);
  std::string type_name() const override { return "Qwen3VLVisionBlock"; }

  // x: [N, Hv] -> [N, Hv]; attention within each segment of cu_seqlens (one per image slice).
  Tensor forward(const Tensor& x, const Tensor& cu_seqlens, const RopeTables& rope) const;
  // The declared (whole) sizes, for the tensor-parallel plan.
  int64_t hidden_size() const { return qkv_->in_features(); }
  int64_t num_heads() const { return qkv_->out_features() / (3 * head_dim_); }
  int64_t intermediate_size() const { return fc1_->out_features(); }

private:
  int64_t head_dim_;
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<nn::Linear> qkv_, proj_, fc1_, fc2_;
};

// The 2x2 patch merger; post_shuffle_norm: the DeepStack form (LayerNorm over the 4·Hv vector).
class VisionPatchMerger : public nn::Module {
public:
  VisionPatchMerger(const VisionConfig& config, bool post_shuffle_norm, DType dtype);
  std::string type_name() const override { return "Qwen3VLVisionPatchMerger"; }

  // x: [N, Hv] with N a multiple of merge² -> [N / merge², out_hidden_size].
  Tensor forward(const Tensor& x) const;

private:
  int64_t merged_dim_;
  bool post_shuffle_norm_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

struct VisionFeatures {
  Tensor embeds;                 // [N / merge², out] for the image placeholder tokens
  std::vector<Tensor> deepstack; // one [N / merge², out] per DeepStack merger, in block order
};

class VisionTower : public nn::Module {
public:
  VisionTower(const VisionConfig& config, DType dtype);
  std::string type_name() const override { return "Qwen3VLVisionModel"; }

  const VisionConfig& config() const { return config_; }
  // pixel_values: [N, patch_dim] (any float dtype; cast to the parameter dtype); grids: every
  // image of the batch in order, Σ t·h·w = N. Errors name the mismatch.
  VisionFeatures forward(const Tensor& pixel_values, const std::vector<GridTHW>& grids) const;
  // The vision blocks in forward order.
  std::vector<nn::Module*> blocks() const;

private:
  VisionConfig config_;
  DType dtype_;
  std::shared_ptr<nn::Module> patch_proj_; // patch_embed.proj
  std::shared_ptr<nn::Embedding> pos_embed_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<VisionPatchMerger> merger_;
  std::shared_ptr<nn::ModuleList> deepstack_mergers_;
};

} // namespace vlm::model
