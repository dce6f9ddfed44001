// Greedy generation with any CausalLM: the prompt (text, and for a VLM its images) is extended
// one argmax token at a time until a stop token or max_new_tokens. Used by `vlmtrain generate`
// and the demo's caption accuracy. The prompt runs once (the prefill, images included) and fills a
// KV cache (model/kv_cache.h); each new token then runs alone against the cache.
#pragma once

#include <cstdint>
#include <vector>

#include "io/loader/position_ids.h"
#include "model/causal_lm.h"

namespace vlm::model {

struct GenerateInput {
  std::vector<int32_t> prompt;     // token ids, image placeholders already expanded
  std::vector<io::GridTHW> grids;  // the prompt's images, in order (VLMs)
  std::vector<float> pixel_values; // [patches, patch_dim] of those images
  int64_t patch_dim = 0;
  int32_t image_token_id = -1; // <|image_pad|> (VLMs: its runs get MRoPE positions)
  int64_t spatial_merge_size = 2;
  // Ids >= this are never picked (the tokenizer's size: a model's vocabulary is padded beyond it,
  // and an untrained model may favour a padding id no tokenizer can decode); 0: no limit.
  int64_t vocab_limit = 0;
};

// The generated ids (without the prompt; a stop token that ended it included). Runs on the
// model's device without gradients.
std::vector<int32_t> greedy_generate(const model::CausalLM& model, const GenerateInput& input,
                                     int64_t max_new_tokens, const std::vector<int32_t>& stop_ids,
                                     Device device);

} // namespace vlm::model
