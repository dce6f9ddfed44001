#include "model/text/text_tp_plan.h"

#include "model/text/gated_deltanet.h"
#include "model/text/mlp.h"
#include "model/text/self_attention.h"
#include "model/text/text_causal_lm.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

using parallel::TpSegment;

void attention_plan(parallel::TpPlan& plan, const std::string& p, const SelfAttention& a) {
  const SelfAttentionConfig& c = a.config();
  const int64_t Hq = c.num_attention_heads, KV = c.num_key_value_heads, D = c.head_dim;
  plan.colwise(p + "q_proj", {{Hq * D * (c.output_gate ? 2 : 1), Hq}});
  plan.colwise(p + "k_proj", {{KV * D, KV}});
  plan.colwise(p + "v_proj", {{KV * D, KV}});
  plan.rowwise(p + "o_proj", {{Hq * D, Hq}});
  plan.partial_grads.push_back(p + "q_norm.weight");
  plan.partial_grads.push_back(p + "k_norm.weight");
}

void deltanet_plan(parallel::TpPlan& plan, const std::string& p, const GatedDeltaNet& g) {
  const GatedDeltaNetConfig& c = g.config();
  const int64_t HK = c.num_key_heads, HV = c.num_value_heads;
  const std::vector<TpSegment> qkv = {
      {HK * c.key_head_dim, HK}, {HK * c.key_head_dim, HK}, {HV * c.value_head_dim, HV}};
  plan.colwise(p + "in_proj_qkv", qkv);
  plan.colwise(p + "in_proj_z", {{HV * c.value_head_dim, HV}});
  plan.colwise(p + "in_proj_b", {{HV, HV}});
  plan.colwise(p + "in_proj_a", {{HV, HV}});
  plan.split(p + "conv1d.weight", 0, qkv);
  plan.split(p + "A_log", 0, {{HV, HV}});
  plan.split(p + "dt_bias", 0, {{HV, HV}});
  plan.rowwise(p + "out_proj", {{HV * c.value_head_dim, HV}});
  plan.partial_grads.push_back(p + "norm.weight");
}

void mlp_plan(parallel::TpPlan& plan, const std::string& p, const SwiGluMlp& m) {
  const int64_t I = m.intermediate_size();
  plan.colwise(p + "gate_proj", {{I, I}});
  plan.colwise(p + "up_proj", {{I, I}});
  plan.rowwise(p + "down_proj", {{I, I}});
}

} // namespace

parallel::TpPlan text_tp_plan(const CausalLM& model) {
  const auto* lm = dynamic_cast<const TextCausalLM*>(&model);
  VLM_CHECK(lm, model.model_type(), ": no tensor-parallel plan (not a model on the text stack)");
  auto& root = const_cast<CausalLM&>(model); // named_modules() is not const; nothing changes
  std::string text_prefix;
  bool found = false;
  for (auto& [path, m] : root.named_modules())
    if (m == &lm->text_model()) text_prefix = path, found = true;
  VLM_CHECK(found, model.model_type(), ": the text stack is not a module of the model");
  const std::string text = text_prefix.empty() ? "" : text_prefix + ".";

  parallel::TpPlan plan;
  plan.vocab(text + "embed_tokens");
  for (auto& [path, m] : const_cast<TextModel&>(lm->text_model()).named_modules()) {
    const std::string p = text + path + ".";
    if (const auto* a = dynamic_cast<const SelfAttention*>(m))
      attention_plan(plan, p, *a);
    else if (const auto* g = dynamic_cast<const GatedDeltaNet*>(m))
      deltanet_plan(plan, p, *g);
    else if (const auto* mlp = dynamic_cast<const SwiGluMlp*>(m))
      mlp_plan(plan, p, *mlp);
  }
  // The head: its own lm_head, or the embedding it is tied to (by name: the model may be only
  // described yet).
  plan.sequence_region = text + TextModel::kLayers;
  plan.head = text + "embed_tokens.weight";
  for (const nn::ParameterSpec& p : model.parameter_specs())
    if (p.name == "lm_head.weight") plan.head = p.name;
  return plan;
}

} // namespace vlm::model
