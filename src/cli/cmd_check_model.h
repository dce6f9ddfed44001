// `vlmtrain check-model DIR`: whether an HF snapshot folder holds what training will read —
// config.json (a registered model_type; the model described as training describes it), the
// safetensors headers against the parameters (model/hf_weight_plan.h: the loader's own check),
// every tensor's bytes inside its file, tokenizer.json, and for a vision model
// preprocessor_config.json — without allocating or reading the weights, so that a truncated or
// incomplete download fails on the login node in seconds, not on the compute node after the queue.
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

// args: the words after "check-model". Prints one summary line and returns 0 when the snapshot
// is complete; otherwise throws one vlm::Error listing every problem found, each naming its file.
int cmd_check_model(const std::vector<std::string>& args);

} // namespace vlm::cli
