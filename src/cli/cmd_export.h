// `vlmtrain export --checkpoint DIR --out DIR [--dtype bf16|f32]`: an HF snapshot of a checkpoint.
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

int cmd_export(const std::vector<std::string>& args);

} // namespace vlm::cli
