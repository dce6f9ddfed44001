#include "model/causal_lm.h"

#include <cctype>

namespace vlm::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

const char* param_group_name(ParamGroup g) {
  switch (g) {
  case ParamGroup::llm: return "llm";
  case ParamGroup::mlp: return "mlp";
  case ParamGroup::vit: return "vit";
  }
  return "?";
}

ParamKind param_kind_by_name(const std::string& name) {
  if (ends_with(name, ".weight")) {
    // The module's own name: "...norm" or a numbered "...norm1" (vision blocks).
    std::string module = name.substr(0, name.size() - 7);
    module = module.substr(module.rfind('.') + 1);
    while (!module.empty() && std::isdigit(static_cast<unsigned char>(module.back())))
      module.pop_back();
    if (ends_with(module, "norm")) return ParamKind::norm;
    if (module == "pos_embed") return ParamKind::embedding;
  }
  // Gated DeltaNet's per-head decay parameters are offsets like a bias (FLA and Megatron exempt
  // them from weight decay as well).
  if (ends_with(name, ".bias") || ends_with(name, ".dt_bias") || ends_with(name, ".A_log"))
    return ParamKind::bias;
  if (ends_with(name, "embed_tokens.weight")) return ParamKind::embedding;
  return ParamKind::weight;
}

void CausalLM::init_weights(Rng& rng) {
  materialize(); // no-op for parameters already allocated
  initialize(rng);
}

} // namespace vlm::model
