#include "src/train/model_setup.h"

#include <filesystem>

#include "model/model_spec.h"

namespace vlm::train {

namespace fs = std::filesystem;

namespace {

// The id of a special token, or -1 (keep the preset's) when the tokenizer lacks it.
int64_t special_id(const io::Tokenizer& tok, const char* token) {
  try {
    return tok.token_to_id(token);
  } catch (const Error&) {
    return -1;
  }
}

} // namespace

std::shared_ptr<model::CausalLM> describe_model(const TrainConfig& c, const io::Tokenizer& tok) {
  const DType dtype = c.training.param_dtype;
  if (!c.model.preset.empty()) {
    model::PresetOptions o;
    o.min_vocab_size = tok.vocab_size(); // the tokenizer decides the vocabulary
    o.image_token_id = special_id(tok, "<|image_pad|>");
    o.video_token_id = special_id(tok, "<|video_pad|>");
    o.vision_start_token_id = special_id(tok, "<|vision_start|>");
    o.vision_end_token_id = special_id(tok, "<|vision_end|>");
    return model::build_model(model::preset_config(c.model.preset, o),
                              "model.preset \"" + c.model.preset + "\"", dtype);
  }
  return model::build_model(model::read_config_json(c.model.model_dir),
                            (fs::path(c.model.model_dir) / "config.json").string(), dtype);
}

} // namespace vlm::train
