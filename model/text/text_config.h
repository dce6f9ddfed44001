// The fields every Qwen text stack shares (qwen-models.md §1.1, §2.1, §3.1), read from and written
// to an HF config.json object (the top level for Qwen3, text_config for the VLMs) once, for every
// family. A family's config derives from it and adds its own fields (MRoPE sections, layer kinds,
// the vision tower).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/text/decoder_layer.h"

namespace vlm::model {

// What differs between the families when a key is absent (transformers' class defaults).
struct TextDefaults {
  int64_t vocab_size = 0; // 0: the key is required
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 32768;
};

struct TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;         // H
  int64_t intermediate_size = 0;   // I (MLP)
  int64_t num_hidden_layers = 0;   // L
  int64_t num_attention_heads = 0; // Hq
  int64_t num_key_value_heads = 0; // Hkv; Hq % Hkv == 0 (GQA)
  int64_t head_dim = 128;          // D; Hq·D may differ from H (Qwen3-0.6B: 2048 vs 1024)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false; // lm_head = embed_tokens (no lm_head.weight in the file)
  bool attention_bias = false;      // biases on q/k/v/o_proj (false for every released Qwen)
  double initializer_range = 0.02;  // std of the normal init of Linear and Embedding weights
  int64_t max_position_embeddings = 32768;
  std::string torch_dtype = "bfloat16"; // dtype of the stored weights ("float32", "bfloat16")
  // bos_token_id / eos_token_id / pad_token_id as the source had them (eos may be a list):
  // carried through to the written config.json, unused by the model.
  nlohmann::json token_ids = nlohmann::json::object();

  // Reads the shared keys of `t` (hidden_act must be "silu"); rope_theta is the family's business.
  void read_text_json(const nlohmann::json& t, const std::string& where,
                      const TextDefaults& defaults);
  // Writes the shared keys into `t`.
  void write_text_json(nlohmann::json& t) const;
  // Throws vlm::Error naming `who` and the first invalid field (sizes in range, Hq % Hkv == 0,
  // head_dim even, eps > 0, ...).
  void validate_text(const std::string& who) const;

  // The sizes of one (Qwen3-style) decoder layer.
  DecoderLayerConfig decoder_layer() const;
  // Parameters of one Qwen3-style decoder layer (attention, q/k norms, MLP, two norms).
  int64_t decoder_layer_parameters() const;
  // Embeddings, the final norm and the head (counted once when tied).
  int64_t embedding_parameters() const;
  // Weight elements of the MLP and of the LM head, as the FLOP count multiplies them.
  int64_t mlp_matmul_params() const { return 3 * hidden_size * intermediate_size; }
  // "H=64, L=2, Hq=4, Hkv=2, D=32, I=128, vocab=512, tied"
  std::string text_summary() const;
  // The sizes the tiny test configs of qwen-models.md §8 share: vocab 512, H 64, I 128, Hq 4,
  // Hkv 2, eps 1e-6, 4096 positions, stored as float32.
  void set_tiny_sizes();
};

} // namespace vlm::model
