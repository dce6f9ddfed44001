// Skipped samples during training: the short form the progress line shows and the ceiling
// (data.max_skip_fraction) above which training stops. A dataset that silently shrinks (a shard
// truncated while the job runs, a cooker that wrote a wrong field everywhere) is a wrong run, so
// the trainer stops with the loader's report (io::SkipReport: counts by reason, first samples
// named by shard and key) rather than train on what is left.
#pragma once

#include <cstdint>
#include <string>

#include "io/loader/sample_pipeline.h"

namespace vlm::train {

// Skips that count toward the ceiling: all but the drops data.overlong_policy = "drop" asked for
// ("pack:*" reasons), which are reported too.
int64_t bad_samples(const io::SkipReport& report);

// Throws vlm::Error with the report when bad_samples(report) > max_fraction × max(read, 100):
// fewer than 100 samples read count as 100, so one bad sample among the first few does not stop
// a run at 1% while max_fraction = 0 still stops at the first one.
void check_skip_ceiling(const io::SkipReport& report, int64_t read, double max_fraction,
                        const std::string& split);

// "3 samples skipped (chat:invalid_json 2, read:truncated 1)"; "" when none were.
std::string skip_summary_line(const io::SkipReport& report);

} // namespace vlm::train
