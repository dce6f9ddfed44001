// Qwen3's entry in the ModelSpec registry (model/registry.cpp).
#pragma once

#include "model/model_spec.h"

namespace vlm::model {

// model_type "qwen3". Presets (random init; the vocabulary grows to the tokenizer's, rounded up
// to a multiple of 64): "tiny" (qwen-models.md T1, untied) and the released sizes "qwen3-0.6b",
// "qwen3-1.7b", "qwen3-4b", "qwen3-8b" (§1.1).
ModelSpec qwen3_model_spec();

} // namespace vlm::model
