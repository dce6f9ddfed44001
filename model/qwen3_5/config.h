// Qwen3.5 (dense, hybrid Gated DeltaNet + gated attention, with vision) configuration: an HF
// config.json with text_config (model_type "qwen3_5_text"), vision_config ("qwen3_5_vision") and
// the special token ids (qwen-models.md §3.1), read and written as transformers' Qwen3_5Config:
//   * layer_types lists each layer's kind ("linear_attention" | "full_attention"); when absent
//     it is built from full_attention_interval (default 4: every 4th layer is full attention);
//   * text RoPE from rope_parameters {rope_type "default", rope_theta (10000),
//   partial_rotary_factor
//     (0.25), mrope_section ([11, 11, 10])}: interleaved MRoPE over the first
//     head_dim · partial_rotary_factor dims;
//   * the Gated DeltaNet sizes linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
//     linear_value_head_dim, linear_conv_kernel_dim;
//   * tie_word_embeddings from the top level (falling back to text_config's);
//   * keys transformers does not read (attn_output_gate, mamba_ssm_dtype, mtp_*,
//     full_attention_interval) are carried through to the written config.json unchanged.
// The vision tower is model/vision/'s with no DeepStack. The MoE variant ("qwen3_5_moe") is
// refused by the registry.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/text/gated_deltanet.h"
#include "model/text/text_config.h"
#include "model/vision/vision_language.h"

namespace vlm::model {

struct Qwen3_5Config : TextConfig, VisionLanguageFields {
  std::array<int64_t, 3> mrope_section = {11, 11, 10}; // sum = rotary_dim() / 2
  double partial_rotary_factor = 0.25;
  std::vector<std::string> layer_types; // per layer: "linear_attention" | "full_attention"
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_conv_kernel_dim = 4;
  // text_config keys kept as read (see above).
  nlohmann::json carried_text_keys = nlohmann::json::object();

  Qwen3_5Config();
  // Dims of each attention head that RoPE rotates (head_dim · partial_rotary_factor).
  int64_t rotary_dim() const;
  bool is_linear_attention(int64_t layer) const;
  int64_t num_linear_attention_layers() const;
  // The sizes of a full-attention layer (gated, zero-centred norms) and of a Gated DeltaNet.
  DecoderLayerConfig decoder_layer() const;
  GatedDeltaNetConfig gated_deltanet() const;

  // Throws vlm::Error naming the first invalid field.
  void validate() const;
  static Qwen3_5Config from_json(const nlohmann::json& j, const std::string& where);
  // An HF-loadable config.json (Qwen3_5ForConditionalGeneration).
  nlohmann::json to_json() const;
  int64_t num_parameters() const;
  // "Qwen3.5(text H=64, L=8 (6 linear), ..., GDN HK=2 HV=4 dk=32 dv=16; vision ...)"
  std::string summary() const;
};

// T3 of qwen-models.md §8 (what the golden files of tools/golden/gen_qwen3_5.py use, "hybrid"):
// text H=64, L=8 = ([linear]*3 + [full]) * 2, Hq=4, Hkv=2, D=64, rotary 16, mrope [3,3,2], θ=1e7,
// I=16, vocab=512; GDN HK=2, HV=4, dk=32, dv=16, K=4; vision depth 2, Hv=16, 1 head, Iv=32,
// 8x8 position table, out 64, no DeepStack; image/video/start/end tokens 500..503.
Qwen3_5Config tiny_qwen3_5_config(bool tie_word_embeddings = false);

} // namespace vlm::model
