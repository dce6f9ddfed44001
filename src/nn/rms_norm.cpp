#include "src/nn/rms_norm.h"

#include "src/core/ops/norm.h"

namespace vlm::nn {

RMSNorm::RMSNorm(int64_t dim, RMSNormOptions options) : options_(options) {
  VLM_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  declare_parameter("weight", {dim}, options.zero_centered ? Init::zeros() : Init::ones(),
                    options.dtype);
}

// Each form runs through call() when something is attached (parallelism applied from outside,
// e.g. sequence parallelism at the norms); otherwise directly.
Tensor RMSNorm::forward(const Tensor& x) const {
  auto run = [this](const std::vector<Tensor>& in) {
    return std::vector{options_.zero_centered
                           ? rms_norm_zero_centered(in[0], weight(), options_.eps)
                           : rms_norm(in[0], weight(), options_.eps)};
  };
  return has_forward_hooks() ? call(run, {x})[0] : run({x})[0];
}

std::pair<Tensor, Tensor> RMSNorm::add_forward(const Tensor& x, const Tensor& h) const {
  auto run = [this](const std::vector<Tensor>& in) {
    auto [sum, normed] = add_rms_norm(in[0], in[1], weight(), options_.eps, options_.zero_centered);
    return std::vector{sum, normed};
  };
  const std::vector<Tensor> out = has_forward_hooks() ? call(run, {x, h}) : run({x, h});
  return {out[0], out[1]};
}

Tensor RMSNorm::forward_rope(const Tensor& x, const RopeTables& tables) const {
  auto run = [this, tables](const std::vector<Tensor>& in) {
    return std::vector{
        rms_norm_rope(in[0], weight(), options_.eps, tables, options_.zero_centered)};
  };
  return has_forward_hooks() ? call(run, {x})[0] : run({x})[0];
}

} // namespace vlm::nn
