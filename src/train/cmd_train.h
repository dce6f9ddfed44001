// `vlmtrain train [--config FILE] [--set section.key=value ...]` and `vlmtrain export`.
#pragma once

#include <string>
#include <vector>

namespace vlm::train {

int cmd_train(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);

} // namespace vlm::train
