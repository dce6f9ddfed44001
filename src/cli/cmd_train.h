// `vlmtrain train [--config FILE] [--set section.key=value ...]`.
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

// The exit code of a run stopped by SIGTERM or SIGUSR1 after saving its checkpoint: EX_TEMPFAIL
// (sysexits.h), "try again": a job script requeues on it (jobs/README.md).
inline constexpr int kRequeueExitCode = 75;

int cmd_train(const std::vector<std::string>& args);

} // namespace vlm::cli
