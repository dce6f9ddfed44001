// The vision tower's configuration (HF `vision_config`, qwen-models.md §2.1 and §2.4), shared by
// Qwen3-VL and Qwen3.5. Reading follows transformers 5.24's Qwen3VLVisionConfig: absent keys take
// its class defaults (the 27-layer tower of Qwen3-VL-8B); model_type may be "qwen3_vl_vision" or
// the checkpoints' older "qwen3_vl" (transformers rewrites it on load), or Qwen3.5's
// "qwen3_5_vision" / "qwen3_5", whose towers have no DeepStack (no default indexes). Only what the
// tower computes is accepted: hidden_act "gelu_pytorch_tanh", square position tables, head dims
// that are multiples of 4 (the 2-D rotary splits hd/2 into row and column halves).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlm::model {

struct VisionConfig {
  int64_t depth = 27;
  int64_t hidden_size = 1152;       // Hv
  int64_t intermediate_size = 4304; // Iv
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t out_hidden_size = 3584;         // the LLM's hidden size
  int64_t num_position_embeddings = 2304; // a square table (48 x 48)
  // Blocks whose outputs feed the DeepStack mergers (Qwen3-VL; empty for Qwen3.5).
  std::vector<int64_t> deepstack_visual_indexes = {8, 16, 24};
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-6; // fixed in transformers (nn.LayerNorm(eps=1e-6))
  double rope_theta = 10000.0;  // the 2-D rotary's; no key stores it

  int64_t head_dim() const { return hidden_size / num_heads; }
  // Values of one pixel row: channels · temporal_patch · patch² (1536).
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // Side of the position table (48).
  int64_t table_side() const;
  // Parameters of the tower, mergers included.
  int64_t num_parameters() const;

  // Throws vlm::Error naming the first invalid field.
  void validate() const;
  // Parses an HF vision_config object; `where` prefixes every error. `default_type` stands for
  // an absent model_type (the family's tower: "qwen3_5_vision" has no DeepStack by default).
  static VisionConfig from_json(const nlohmann::json& j, const std::string& where,
                                const std::string& default_type = "qwen3_vl_vision");
  // The vision_config object transformers reads (model_type as given).
  nlohmann::json to_json(const std::string& model_type) const;
};

} // namespace vlm::model
