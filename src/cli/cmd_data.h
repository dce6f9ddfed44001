// `vlmtrain data <make-demo|inspect> ...`: dataset tools.
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

int cmd_data(const std::vector<std::string>& args);

} // namespace vlm::cli
