// Qwen3-VL's entries in the ModelSpec registry (model/registry.cpp).
#pragma once

#include "model/model_spec.h"

namespace vlm::model {

// model_type "qwen3_vl" (dense). Presets (random init; the vocabulary grows to the tokenizer's,
// rounded up to a multiple of 64, and the image / video / vision start / end ids follow the
// tokenizer's when it has them): "tiny-vl" (qwen-models.md T2, untied) and the released sizes
// "qwen3-vl-2b", "qwen3-vl-4b", "qwen3-vl-8b", "qwen3-vl-32b".
ModelSpec qwen3_vl_model_spec();

// model_type "qwen3_vl_moe": listed, and refused with a clear error until MoE exists.
ModelSpec qwen3_vl_moe_model_spec();

} // namespace vlm::model
