#include "model/causal_lm.h"

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
  if (ends_with(name, "norm.weight")) return ParamKind::norm;
  if (ends_with(name, ".bias")) return ParamKind::bias;
  if (ends_with(name, "embed_tokens.weight")) return ParamKind::embedding;
  return ParamKind::weight;
}

void CausalLM::init_weights(Rng& rng) {
  materialize(); // no-op for parameters already allocated
  initialize(rng);
}

} // namespace vlm::model
