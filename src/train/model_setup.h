// The model a training config names, described (parameters declared, none allocated): a
// preset (model.preset, sized by the tokenizer) or an HF snapshot's config.json
// (model.model_dir). Shared by the trainer and the commands that must know the model's kind
// (e.g. `data pack --config`: a vision model keeps its images).
#pragma once

#include <memory>

#include "io/text/tokenizer.h"
#include "model/causal_lm.h"
#include "src/train/config.h"

namespace vlm::train {

// A preset takes its vocabulary size (at least the tokenizer's) and its special-token ids
// (<|image_pad|>, <|video_pad|>, <|vision_start|>, <|vision_end|>, where the tokenizer has them)
// from the tokenizer. Errors name the preset or the config.json.
std::shared_ptr<model::CausalLM> describe_model(const TrainConfig& config,
                                                const io::Tokenizer& tokenizer);

} // namespace vlm::train
