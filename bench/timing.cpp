#include "bench/timing.h"

#include <algorithm>

#include "parallel/comm/process_group.h"
#include "src/base/check.h"

namespace vlm::bench {

double median(std::vector<double> v) {
  VLM_CHECK(!v.empty(), "bench::median: no timings");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void add_timing_options(CLI::App& app, Timing& t, const std::string& iters_flag,
                        const std::string& runs) {
  app.add_option(iters_flag, t.iters, "timed " + runs)->check(cli::at_least(1));
  app.add_option("--warmup", t.warmup, "untimed " + runs + " first")->check(cli::at_least(0));
}

Timer::Timer(Device device, parallel::ProcessGroup* ranks, bool whole_device)
    : device_(device), ranks_(ranks), whole_device_(whole_device) {}

double Timer::seconds(const std::function<void()>& fn) const {
  if (ranks_) { // start together: nothing of an earlier run still queued, then a barrier
    synchronize_device(device_);
    ranks_->barrier();
  }
  const Stream stream = current_stream(device_);
  start_.record(stream);
  fn();
  if (whole_device_) synchronize_device(device_);
  end_.record(stream);
  double s = double(start_.elapsed_ms(end_)) * 1e-3; // waits for the closing event
  if (ranks_) s = ranks_->all_reduce_value(s, parallel::ReduceOp::max);
  return s;
}

std::vector<double> Timer::runs(const Timing& t, const std::function<void()>& fn) const {
  std::vector<double> s;
  for (int64_t i = 0; i < t.warmup + t.iters; i++) {
    const double run = seconds(fn);
    if (i >= t.warmup) s.push_back(run);
  }
  return s;
}

std::pair<double, double> Timer::interleaved(const Timing& t, const std::function<void()>& a,
                                             const std::function<void()>& b) const {
  std::vector<double> sa, sb;
  for (int64_t i = 0; i < t.warmup + t.iters; i++) {
    const double ta = seconds(a), tb = seconds(b);
    if (i >= t.warmup) sa.push_back(ta), sb.push_back(tb);
  }
  return {median(sa), median(sb)};
}

} // namespace vlm::bench
