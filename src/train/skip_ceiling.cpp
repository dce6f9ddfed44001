#include "src/train/skip_ceiling.h"

#include <algorithm>
#include <cstdio>

#include "src/base/check.h"

namespace vlm::train {

int64_t bad_samples(const io::SkipReport& report) {
  int64_t n = 0;
  for (const auto& [reason, count] : report.counts)
    if (reason.rfind("pack:", 0) != 0) n += count;
  return n;
}

void check_skip_ceiling(const io::SkipReport& report, int64_t read, double max_fraction,
                        const std::string& split) {
  const int64_t bad = bad_samples(report);
  if (double(bad) <= max_fraction * double(std::max<int64_t>(read, 100))) return;
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%",
                100.0 * double(bad) / double(std::max<int64_t>(1, read)));
  VLM_FAIL("data: ", bad, " of the ", read, " samples read from data.train_split '", split,
           "' were skipped as bad (", share, "), more than data.max_skip_fraction = ", max_fraction,
           " allows; training stops rather than go on with a shrinking dataset. "
           "Fix or remove the samples below (`vlmtrain data inspect` lists them), or raise "
           "data.max_skip_fraction.\n",
           report.summary());
}

std::string skip_summary_line(const io::SkipReport& report) {
  if (report.total() == 0) return "";
  std::string s = std::to_string(report.total()) + " samples skipped (";
  bool first = true;
  for (const auto& [reason, count] : report.counts) {
    s += (first ? "" : ", ") + reason + " " + std::to_string(count);
    first = false;
  }
  return s + ")";
}

} // namespace vlm::train
