#include "src/nn/layer_norm.h"

#include "src/core/ops/norm.h"

namespace vlm::nn {

LayerNorm::LayerNorm(int64_t dim, LayerNormOptions options) : options_(options) {
  VLM_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  declare_parameter("weight", {dim}, Init::ones(), options.dtype);
  declare_parameter("bias", {dim}, Init::zeros(), options.dtype);
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return layer_norm(x, weight(), bias(), options_.eps);
}

} // namespace vlm::nn
