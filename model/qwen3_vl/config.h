// Qwen3-VL (dense) configuration: an HF config.json with text_config (model_type
// "qwen3_vl_text"), vision_config and the special token ids (qwen-models.md §2.1), read and written
// as transformers 5.24's Qwen3VLConfig does:
//   * text RoPE from text_config.rope_parameters {rope_type "default", rope_theta, mrope_section}
//     or the legacy rope_scaling + rope_theta; theta defaults to 500000 and mrope_section to
//     [24, 20, 20] (transformers' fallbacks), and the sections must cover head_dim / 2 slots;
//   * tie_word_embeddings from the top level (falling back to text_config's), default false;
//   * vision_config as model/vision/vision_config.h; its out_hidden_size must be the text hidden
//     size.
// The MoE variant (model_type "qwen3_vl_moe") is a different model and is refused by the
// registry.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/text/text_config.h"
#include "model/vision/vision_language.h"

namespace vlm::model {

struct Qwen3VLConfig : TextConfig, VisionLanguageFields {
  std::array<int64_t, 3> mrope_section = {24, 20, 20}; // slots of t, h, w; sum = head_dim / 2

  Qwen3VLConfig();
  // Throws vlm::Error naming the first invalid field.
  void validate() const;
  static Qwen3VLConfig from_json(const nlohmann::json& j, const std::string& where);
  // An HF-loadable config.json (Qwen3VLForConditionalGeneration).
  nlohmann::json to_json() const;
  int64_t num_parameters() const;
  // "Qwen3-VL(text H=64, L=4, ..., vision depth=4, Hv=64, ...)"
  std::string summary() const;
};

// T2 of qwen-models.md §8: text H=64, L=4, Hq=4, Hkv=2, D=32, I=128, vocab=512, θ=5e6, mrope
// [6, 5, 5]; vision depth 4, Hv=64, 4 heads (hd 16), Iv=128, 8x8 position table, out 64,
// DeepStack after blocks [0, 2, 3]; image/video/start/end tokens 500..503. For tests and the demo.
Qwen3VLConfig tiny_qwen3_vl_config(bool tie_word_embeddings = false);

} // namespace vlm::model
