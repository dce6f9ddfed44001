#include "model/text/mlp.h"

#include "src/core/ops/activation.h"

namespace vlm::model {

SwiGluMlp::SwiGluMlp(int64_t H, int64_t I, double initializer_range, DType dtype) {
  nn::LinearOptions opts;
  opts.bias = false;
  opts.weight_init = nn::Init::normal(initializer_range);
  opts.dtype = dtype;
  gate_ = register_module("gate_proj", std::make_shared<nn::Linear>(H, I, opts));
  up_ = register_module("up_proj", std::make_shared<nn::Linear>(H, I, opts));
  down_ = register_module("down_proj", std::make_shared<nn::Linear>(I, H, opts));
}

Tensor SwiGluMlp::forward(const Tensor& h) const {
  return down_->forward(swiglu(gate_->forward(h), up_->forward(h)));
}

} // namespace vlm::model
