#include "model/vision/vision_tp_plan.h"

#include "model/text/text_tp_plan.h"
#include "model/vision/vision_tower.h"

namespace vlm::model {

parallel::TpPlan vision_language_tp_plan(const CausalLM& model) {
  parallel::TpPlan plan = text_tp_plan(model);
  auto& root = const_cast<CausalLM&>(model); // named_modules() is not const; nothing changes
  for (auto& [path, m] : root.named_modules()) {
    const auto* block = dynamic_cast<const VisionBlock*>(m);
    if (!block) continue;
    const std::string p = path + ".";
    const int64_t Hv = block->hidden_size(), heads = block->num_heads(),
                  I = block->intermediate_size();
    plan.colwise_optional(p + "attn.qkv", {{Hv, heads}, {Hv, heads}, {Hv, heads}});
    plan.rowwise_optional(p + "attn.proj", {{Hv, heads}});
    plan.colwise_optional(p + "mlp.linear_fc1", {{I, I}});
    plan.rowwise_optional(p + "mlp.linear_fc2", {{I, I}});
  }
  return plan;
}

} // namespace vlm::model
