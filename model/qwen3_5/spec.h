// The Qwen3.5 entries of the ModelSpec registry (model/model_spec.h): the dense family
// ("qwen3_5") and its refused MoE sibling ("qwen3_5_moe").
#pragma once

#include "model/model_spec.h"

namespace vlm::model {

ModelSpec qwen3_5_model_spec();
ModelSpec qwen3_5_moe_model_spec();

} // namespace vlm::model
