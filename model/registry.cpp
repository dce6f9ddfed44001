// The built-in model families: one line each (model/model_spec.h).
#include "model/model_spec.h"
#include "model/qwen3/spec.h"

namespace vlm::model {

std::vector<ModelSpec> builtin_model_specs() {
  return {
      qwen3_model_spec(),
  };
}

} // namespace vlm::model
