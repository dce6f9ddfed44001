#include "model/vision/vision_language_lm.h"

namespace vlm::model {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

} // namespace

std::vector<nn::Module*> VisionLanguageLM::blocks() const {
  std::vector<nn::Module*> out = visual_->blocks();
  for (nn::Module* layer : text_->layers()) out.push_back(layer);
  return out;
}

ParamRole VisionLanguageLM::param_role(const std::string& name) const {
  ParamGroup group = ParamGroup::llm;
  if (starts_with(name, "model.visual.merger.") ||
      starts_with(name, "model.visual.deepstack_merger_list."))
    group = ParamGroup::mlp;
  else if (starts_with(name, "model.visual."))
    group = ParamGroup::vit;
  return {group, param_kind_by_name(name)};
}

nn::Module& VisionLanguageLM::register_tower(const VisionConfig& vision) {
  auto& model = *register_module("model", std::make_shared<nn::Module>());
  visual_ = model.register_module("visual", std::make_shared<VisionTower>(vision, dtype_));
  return model;
}

FusedEmbeddings VisionLanguageLM::embed(const Batch& b, int64_t image_token_id) const {
  check_text_batch(b);
  check_vision_batch(b, who_);
  return fuse_image_features(*visual_, text_->embed(b.input_ids), b, image_token_id, dtype_, who_);
}

} // namespace vlm::model
