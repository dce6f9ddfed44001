// Qwen3 (dense text) configuration: the fields of an HF `config.json` that define the model
// (qwen-models.md §1.1), read from a snapshot and written back in a form transformers loads.
//
// Reading follows transformers' Qwen3Config, so a config.json means the same model here and
// there: head_dim defaults to 128 when absent (the HF class default, not hidden/heads),
// num_key_value_heads to num_attention_heads, rope_theta to 10000, tie_word_embeddings to false.
// RoPE comes from `rope_parameters: {rope_type, rope_theta}` (transformers 5) or the legacy
// top-level `rope_theta` + `rope_scaling` (transformers 4); the first wins when both are present,
// as in transformers 5. Only what this implementation computes is accepted: rope type "default",
// hidden_act "silu", no sliding window, every layer full attention; anything else is an error
// naming the file and the key, never a silently different model. The sizes (vocab_size,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads) are required.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/text/text_config.h"

namespace vlm::model {

struct Qwen3Config : TextConfig {
  // Throws vlm::Error naming the first invalid field (sizes > 0, Hq % Hkv == 0, eps > 0, ...).
  void validate() const;
  // Parses an HF config.json object; `where` (the file name) prefixes every error message.
  static Qwen3Config from_json(const nlohmann::json& j, const std::string& where);
  // Reads `<snapshot_dir>/config.json` (or the file itself when given a .json path).
  static Qwen3Config load(const std::string& snapshot_dir);
  // An HF-loadable config.json (model_type "qwen3", architectures ["Qwen3ForCausalLM"], both the
  // transformers-5 rope_parameters and the legacy rope_theta, torch_dtype and dtype).
  nlohmann::json to_json() const;

  // Parameter count (lm_head included only when untied).
  int64_t num_parameters() const;
  // "Qwen3(H=64, L=2, Hq=4, Hkv=2, D=32, I=128, vocab=512, tied)"
  std::string summary() const;
};

// T1 of qwen-models.md §8: H=64, L=2, Hq=4, Hkv=2, D=32 (Hq·D = 128 != H), I=128, vocab=512,
// rope_theta=1e6, eps=1e-6. For tests and the built-in demo.
Qwen3Config tiny_qwen3_config(bool tie_word_embeddings = false);

} // namespace vlm::model
