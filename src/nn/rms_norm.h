// RMSNorm over the last dim with a learned [dim] weight. Plain (Qwen3, Qwen3-VL text:
// y = w * x_hat, weight init 1) or zero-centred (Qwen3.5: y = (1 + w) * x_hat, weight init 0 —
// the reference's random_init set it to 1, doubling the scale; docs/reference-trainer.md §9 #6).
#pragma once

#include <utility>

#include "src/core/ops/rope.h"
#include "src/nn/module.h"

namespace vlm::nn {

struct RMSNormOptions {
  double eps = 1e-6;
  bool zero_centered = false;
  DType dtype = DType::f32;
};

class RMSNorm : public Module {
public:
  explicit RMSNorm(int64_t dim, RMSNormOptions options = {});
  std::string type_name() const override { return "RMSNorm"; }

  // x: [..., dim] -> same shape
  Tensor forward(const Tensor& x) const;
  // The residual add before this norm, fused (add_rms_norm): returns (x + h, forward(x + h)),
  // bit-identical on the CPU to add() then forward().
  std::pair<Tensor, Tensor> add_forward(const Tensor& x, const Tensor& h) const;
  // This norm then RoPE, fused (rms_norm_rope): rope(forward(x), tables) for x [T, H, dim] (a per
  // head q/k norm), bit-identical on the CPU to the two ops in sequence.
  Tensor forward_rope(const Tensor& x, const RopeTables& tables) const;
  const Tensor& weight() const { return param("weight"); }
  const RMSNormOptions& options() const { return options_; }

private:
  RMSNormOptions options_;
};

} // namespace vlm::nn
