// Qwen3.5's Gated DeltaNet token mixer ("linear_attn", qwen-models.md §3.4), per token of h [T, H]:
//   qkv = in_proj_qkv(h) -> causal depthwise conv1d (kernel K, history reset at each document
//   start) + SiLU -> q [HK, dk], k [HK, dk], v [HV, dv]; q, k L2-normalized (eps 1e-6);
//   beta = sigmoid(in_proj_b(h)); g = -exp(A_log) · softplus(in_proj_a(h) + dt_bias);
//   o = gated delta rule (state reset at each document start, value head j reads k-head
//   j / (HV / HK), scale dk^-0.5) -> gated RMSNorm with silu(in_proj_z(h)) per value head ->
//   out_proj.
// Parameter names are transformers': in_proj_{qkv,z,b,a}.weight, conv1d.weight [C, 1, K],
// A_log [HV], dt_bias [HV], norm.weight [dv], out_proj.weight.
//
// Generation (a BlockContext with a cache): the cache keeps the last K - 1 conv inputs and the
// delta-rule state, so a step of one token continues the document exactly.
#pragma once

#include <memory>

#include "model/text/text_block.h"
#include "src/nn/linear.h"

namespace vlm::model {

struct GatedDeltaNetConfig {
  int64_t hidden_size = 0;
  int64_t num_key_heads = 0;   // HK
  int64_t num_value_heads = 0; // HV, a multiple of HK
  int64_t key_head_dim = 0;    // dk
  int64_t value_head_dim = 0;  // dv
  int64_t conv_kernel_size = 4;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;

  int64_t key_dim() const { return num_key_heads * key_head_dim; }       // Kd
  int64_t value_dim() const { return num_value_heads * value_head_dim; } // Vd
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }       // C
  // Parameters of the mixer.
  int64_t num_parameters() const;
};

class GatedDeltaNet : public TokenMixer {
public:
  GatedDeltaNet(const GatedDeltaNetConfig& config, DType dtype);
  std::string type_name() const override { return "GatedDeltaNet"; }
  const GatedDeltaNetConfig& config() const { return config_; }
  Tensor forward(const Tensor& h, const BlockContext& ctx) const override;

private:
  // The conv1d over qkv [T, C]; with a cache, continuing its history.
  Tensor conv(const Tensor& qkv, const BlockContext& ctx) const;

  GatedDeltaNetConfig config_;
  std::shared_ptr<nn::Linear> in_qkv_, in_z_, in_b_, in_a_, out_;
  std::shared_ptr<nn::Module> conv1d_, norm_;
};

} // namespace vlm::model
