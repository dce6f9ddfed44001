// `vlmtrain dump`: one forward (+ backward) of an HF snapshot on a given batch, for parity checks
// against transformers (src/train/parity_dump.h does the work).
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

// args: the options after the subcommand name. Returns the process exit code.
int cmd_dump(const std::vector<std::string>& args);

} // namespace vlm::cli
