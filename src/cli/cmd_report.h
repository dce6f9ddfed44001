// `vlmtrain report RUN... [--records FILE]... [--out DIR]`: PNG plots of runs' metrics.jsonl and of
// benchmark records, drawn by tools/report/report.py (matplotlib) — this command finds the script
// and a Python that has matplotlib, and runs it.
#pragma once

#include <string>
#include <vector>

namespace vlm::cli {

// args: the options after the subcommand name. Returns the process exit code (the script's).
int cmd_report(const std::vector<std::string>& args);

} // namespace vlm::cli
