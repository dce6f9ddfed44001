// The SwiGLU MLP of every Qwen decoder layer (the default feed-forward kind): down(silu(gate(h)) *
// up(h)), no biases; parameter names gate_proj, up_proj, down_proj.
#pragma once

#include <memory>

#include "model/text/text_block.h"
#include "src/nn/linear.h"

namespace vlm::model {

class SwiGluMlp : public FeedForward {
public:
  SwiGluMlp(int64_t hidden_size, int64_t intermediate_size, double initializer_range, DType dtype);
  std::string type_name() const override { return "SwiGluMlp"; }
  // h: [T, H] -> [T, H]
  Tensor forward(const Tensor& h) const;
  Tensor forward(const Tensor& h, const BlockContext&) const override { return forward(h); }
  int64_t intermediate_size() const { return down_->in_features(); }

private:
  std::shared_ptr<nn::Linear> gate_, up_, down_;
};

} // namespace vlm::model
