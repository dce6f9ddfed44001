#include "src/nn/linear.h"

#include "src/core/ops/matmul.h"

namespace vlm::nn {

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : in_(in_features), out_(out_features), has_bias_(options.bias) {
  VLM_CHECK(in_features > 0 && out_features > 0,
            "Linear: features must be positive, got in=", in_features, " out=", out_features);
  declare_parameter("weight", {out_features, in_features}, options.weight_init, options.dtype);
  if (has_bias_) declare_parameter("bias", {out_features}, options.bias_init, options.dtype);
}

Tensor Linear::forward(const Tensor& x) const {
  if (!has_forward_hooks()) return linear(x, weight(), bias());
  // Through call(): tensor parallelism wraps projections (parallel/tp/tensor_parallel.h).
  return call(
      [this](const std::vector<Tensor>& in) {
        return std::vector{linear(in[0], weight(), bias())};
      },
      {x})[0];
}

} // namespace vlm::nn
