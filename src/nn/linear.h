// Linear: y = x W^T + b with W [out_features, in_features] (HF/PyTorch layout, so checkpoint
// weights load without transposes).
#pragma once

#include "src/nn/module.h"

namespace vlm::nn {

struct LinearOptions {
  bool bias = false;
  Init weight_init = Init::normal(0.02); // HF initializer_range for Qwen models
  Init bias_init = Init::zeros();
  DType dtype = DType::f32;
};

class Linear : public Module {
public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  std::string type_name() const override { return "Linear"; }

  // x: [..., in_features] -> [..., out_features]
  Tensor forward(const Tensor& x) const;

  const Tensor& weight() const { return param("weight"); }
  // Undefined when the layer has no bias.
  Tensor bias() const { return has_bias_ ? param("bias") : Tensor(); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

private:
  int64_t in_, out_;
  bool has_bias_;
};

} // namespace vlm::nn
