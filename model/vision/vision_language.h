// What the vision-language families (Qwen3-VL, Qwen3.5) share around their tower: the
// config.json fields that join the tower to the text stack (vision_config and the special token
// ids, qwen-models.md §2.1, §3.1), the fusion of image features into the token embeddings (§2.5)
// and the tower's training FLOPs (§7). The CausalLM base: model/vision/vision_language_lm.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "model/model_spec.h"
#include "model/text/text_config.h"
#include "model/vision/vision_config.h"
#include "model/vision/vision_tower.h"

namespace vlm::model {

struct VisionLanguageFields {
  VisionConfig vision;
  std::string vision_model_type; // vision_config.model_type, written back as read
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;

  // Reads vision_config and the token ids of the top-level object `j`.
  void read_vision_json(const nlohmann::json& j, const std::string& where,
                        const std::string& default_vision_type);
  // Writes them into the top-level object `j`.
  void write_vision_json(nlohmann::json& j) const;
  // The tower's output must be the text width; every special id inside the vocabulary.
  void validate_vision(const std::string& who, int64_t vocab_size, int64_t hidden_size) const;
  // "vision depth=4, Hv=64, heads=4, Iv=128, deepstack=3"
  std::string vision_summary() const;
  // The tiny test configs' tower (qwen-models.md §8 T2: depth 4, Hv 64, 4 heads, Iv 128, an 8x8
  // position table, out 64, DeepStack after blocks 0, 2, 3) and special ids (image 500, video
  // 501, vision start 502, end 503).
  void set_tiny_vision();
};

// The token embeddings x [T, H] with the image placeholders (input_ids == image_token_id) replaced,
// in order, by the tower's features of the batch's images — a mask multiply and a scatter-add,
// so the placeholder's embedding row gets no gradient, as with transformers' masked_scatter. The
// counts must match. A batch without images (and not decoding) runs the tower on one blank
// 2x2-patch image whose features are scaled by 0: every vision parameter gets a gradient (exactly
// zero) and every vision block runs, so each step has the same gradients and blocks whatever its
// data (FSDP needs both). `image_positions` receives the placeholder rows (for DeepStack) and
// `deepstack` the tower's DeepStack features (empty without images).
struct FusedEmbeddings {
  Tensor embeds;
  Tensor image_positions; // [N] i64, undefined without images
  std::vector<Tensor> deepstack;
};
FusedEmbeddings fuse_image_features(const VisionTower& tower, const Tensor& token_embeds,
                                    const Batch& batch, int64_t image_token_id, DType dtype,
                                    const char* who);

// A vision-language config.json (transformers' layout: text_config, vision_config and the special
// ids at the top level). vlm_text_config checks that `j` is an object of `model_type` whose
// text_config is one of `text_model_type` and returns that text_config; read_vlm_config reads the
// rest: tie_word_embeddings (the top level wins over text_config's), vision_config and the ids, the
// stored dtype (top level, then text_config's), bos / eos / pad. Errors name `where`.
nlohmann::json vlm_text_config(const nlohmann::json& j, const std::string& where,
                               const char* model_type, const char* text_model_type,
                               const char* family);
void read_vlm_config(const nlohmann::json& j, const nlohmann::json& text_config,
                     const std::string& where, const std::string& default_vision_type,
                     TextConfig& text, VisionLanguageFields& vision);
// The config.json around a written text_config (model_type already set in it).
nlohmann::json vlm_config_json(const nlohmann::json& text_config, const char* architecture,
                               const char* model_type, const TextConfig& text,
                               const VisionLanguageFields& vision);

// A built-in config adapted to the run's tokenizer: the vocabulary grown to its size (rounded up
// to a multiple of 64) and its special ids (model/model_spec.h: PresetOptions).
void adapt_to_tokenizer(int64_t& vocab_size, VisionLanguageFields& fields,
                        const PresetOptions& options);

// The batch checks a VLM adds to a text batch's: [3, T] or [T] position ids, pixel_values and
// image_grid_thw together.
void check_vision_batch(const Batch& batch, const char* who);

// The tower's training FLOPs for `image_grids` (patch embedding, blocks with attention over each
// frame's patches, the merger and the DeepStack mergers), added to `flops`.
void add_vision_flops(TrainingFlops& flops, const VisionConfig& vision,
                      const std::vector<std::array<int64_t, 3>>& image_grids);

} // namespace vlm::model
