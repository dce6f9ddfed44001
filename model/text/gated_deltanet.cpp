#include "model/text/gated_deltanet.h"

#include <cmath>
#include <vector>

#include "src/core/autograd.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/conv1d.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/gated_delta.h"
#include "src/core/ops/norm.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

// A_log = log(U(0.01, 16)), as transformers initialises it (the lower bound keeps log A finite).
nn::Init a_log_init() {
  return nn::Init::custom([](Tensor& param, Rng& rng) {
    std::vector<double> v(size_t(param.numel()));
    for (double& x : v) x = std::log(rng.uniform(0.01, 16.0));
    NoGradGuard no_grad;
    Tensor src = Tensor::from_doubles(v, param.shape(), param.dtype(), param.device());
    copy_(param, src);
  });
}

// The rows [from, to) of the columns of x [T, C], as a contiguous [T, heads, dim].
Tensor columns(const Tensor& x, int64_t from, int64_t to, int64_t dim) {
  const int64_t T = x.size(0);
  return reshape(copy(slice(x, 1, from, to)), {T, (to - from) / dim, dim});
}

} // namespace

int64_t GatedDeltaNetConfig::num_parameters() const {
  const int64_t H = hidden_size, HV = num_value_heads;
  return H * conv_dim() + H * value_dim() + 2 * H * HV + conv_dim() * conv_kernel_size + 2 * HV +
         value_head_dim + value_dim() * H;
}

GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetConfig& c, DType dtype) : config_(c) {
  nn::LinearOptions opts;
  opts.bias = false;
  opts.weight_init = nn::Init::normal(c.initializer_range);
  opts.dtype = dtype;
  const int64_t H = c.hidden_size, HV = c.num_value_heads;
  // Registration order = HF's state-dict order.
  in_qkv_ = register_module("in_proj_qkv", std::make_shared<nn::Linear>(H, c.conv_dim(), opts));
  in_z_ = register_module("in_proj_z", std::make_shared<nn::Linear>(H, c.value_dim(), opts));
  in_b_ = register_module("in_proj_b", std::make_shared<nn::Linear>(H, HV, opts));
  in_a_ = register_module("in_proj_a", std::make_shared<nn::Linear>(H, HV, opts));
  conv1d_ = register_module("conv1d", std::make_shared<nn::Module>());
  conv1d_->declare_parameter("weight", {c.conv_dim(), 1, c.conv_kernel_size},
                             nn::Init::normal(c.initializer_range), dtype);
  declare_parameter("A_log", {HV}, a_log_init(), dtype);
  declare_parameter("dt_bias", {HV}, nn::Init::ones(), dtype);
  norm_ = register_module("norm", std::make_shared<nn::Module>());
  norm_->declare_parameter("weight", {c.value_head_dim}, nn::Init::ones(), dtype);
  out_ = register_module("out_proj", std::make_shared<nn::Linear>(c.value_dim(), H, opts));
}

Tensor GatedDeltaNet::conv(const Tensor& qkv, const BlockContext& ctx) const {
  const Tensor& w = conv1d_->param("weight");
  const Tensor weight = reshape(w, {w.size(0), w.size(2)});
  if (!ctx.cache) return causal_conv1d(qkv, weight, ctx.varlen, /*silu=*/true);
  // Generation: the cached inputs (zeros before the document) go in front of the new ones.
  const int64_t K = weight.size(1), T = qkv.size(0);
  Tensor& history = ctx.cache->conv_history;
  if (!history.defined()) history = Tensor::zeros({K - 1, qkv.size(1)}, qkv.dtype(), qkv.device());
  const Tensor x = concat({history, qkv}, 0);
  history = copy(slice(x, 0, T, T + K - 1));
  const Tensor cu = Tensor::from_vector(std::vector<int32_t>{0, int32_t(T + K - 1)}, {2});
  return slice(causal_conv1d(x, weight, cu, /*silu=*/true), 0, K - 1, T + K - 1);
}

Tensor GatedDeltaNet::forward(const Tensor& h, const BlockContext& ctx) const {
  const auto& c = config_;
  const int64_t dk = c.key_head_dim, dv = c.value_head_dim;
  // Head counts from the local weights (tensor parallelism shards them by heads).
  const int64_t HV = in_b_->weight().size(0);
  const int64_t HK = (in_qkv_->weight().size(0) - HV * dv) / (2 * dk);
  const Tensor mixed = conv(in_qkv_->forward(h), ctx);
  const int64_t T = mixed.size(0); // the tokens: h may be a block of them (sequence parallelism)
  const Tensor q = l2_normalize(columns(mixed, 0, HK * dk, dk), 1e-6);
  const Tensor k = l2_normalize(columns(mixed, HK * dk, 2 * HK * dk, dk), 1e-6);
  const Tensor v = columns(mixed, 2 * HK * dk, 2 * HK * dk + HV * dv, dv);
  const Tensor beta = sigmoid(in_b_->forward(h));
  const Tensor g =
      mul(neg(exp(param("A_log"))), softplus(add(in_a_->forward(h), param("dt_bias"))));
  const Tensor o = gated_delta_rule(q, k, v, g, beta, ctx.varlen, 1.0 / std::sqrt(double(dk)),
                                    ctx.cache ? &ctx.cache->state : nullptr);
  const Tensor z = reshape(in_z_->forward(h), {T, HV, dv});
  const Tensor n = rms_norm_gated(o, z, norm_->param("weight"), c.rms_norm_eps);
  return out_->forward(reshape(n, {T, HV * dv}));
}

} // namespace vlm::model
