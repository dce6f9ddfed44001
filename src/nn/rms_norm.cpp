#include "src/nn/rms_norm.h"

#include "src/core/ops/norm.h"

namespace vlm::nn {

RMSNorm::RMSNorm(int64_t dim, RMSNormOptions options) : options_(options) {
  VLM_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  declare_parameter("weight", {dim}, options.zero_centered ? Init::zeros() : Init::ones(),
                    options.dtype);
}

Tensor RMSNorm::forward(const Tensor& x) const {
  return options_.zero_centered ? rms_norm_zero_centered(x, weight(), options_.eps)
                                : rms_norm(x, weight(), options_.eps);
}

std::pair<Tensor, Tensor> RMSNorm::add_forward(const Tensor& x, const Tensor& h) const {
  return add_rms_norm(x, h, weight(), options_.eps, options_.zero_centered);
}

Tensor RMSNorm::forward_rope(const Tensor& x, const RopeTables& tables) const {
  return rms_norm_rope(x, weight(), options_.eps, tables, options_.zero_centered);
}

} // namespace vlm::nn
