// The built-in model families: one line each (model/model_spec.h).
#include "model/model_spec.h"
#include "model/qwen3/spec.h"
#include "model/qwen3_5/spec.h"
#include "model/qwen3_vl/spec.h"

namespace vlm::model {

std::vector<ModelSpec> builtin_model_specs() {
  return {
      qwen3_model_spec(),   qwen3_vl_model_spec(),    qwen3_vl_moe_model_spec(),
      qwen3_5_model_spec(), qwen3_5_moe_model_spec(),
  };
}

} // namespace vlm::model
