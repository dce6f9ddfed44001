// LayerNorm over the last dim with a learned [dim] weight and bias (the vision towers of Qwen3-VL
// and Qwen3.5): y = (x - mean) / sqrt(var + eps) * weight + bias; weight init 1, bias init 0.
#pragma once

#include "src/nn/module.h"

namespace vlm::nn {

struct LayerNormOptions {
  double eps = 1e-6;
  DType dtype = DType::f32;
};

class LayerNorm : public Module {
public:
  explicit LayerNorm(int64_t dim, LayerNormOptions options = {});
  std::string type_name() const override { return "LayerNorm"; }

  // x: [..., dim] -> same shape
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return param("weight"); }
  const Tensor& bias() const { return param("bias"); }

private:
  LayerNormOptions options_;
};

} // namespace vlm::nn
