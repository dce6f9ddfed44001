// How every benchmark times what it measures (issue 36): `warmup` untimed runs, then `iters` timed
// ones, the figure reported their median. A run is timed between two timing events on the
// device's current stream (src/core/stream.h: CUDA events on a GPU, the host clock on the CPU);
// over several ranks every rank starts a run together (device idle, then a barrier) and the run's
// time is the slowest rank's. Two sides of a comparison (ours and a reference) alternate run by
// run, so that drift in the machine's speed affects both alike.
// Two benchmarks time whole passes instead: bench_tokenizer (a cold pass and the best warm one, in
// process CPU seconds, as its pairing with HF tokenizers does) and bench_loader (one epoch per
// reader-thread count: the throughput a training run would see).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "src/cli/args.h"
#include "src/core/device.h"
#include "src/core/stream.h"

namespace vlm::parallel {
class ProcessGroup;
}

namespace vlm::bench {

// The middle value of v, or of an even count the mean of the two middle ones.
double median(std::vector<double> v);

struct Timing {
  int64_t warmup = 1; // untimed runs first
  int64_t iters = 5;  // timed runs
};

// --warmup and `iters_flag` (the timed runs: "--iters", or "--steps" for the training-step
// benchmarks, "--reps" for the op benchmarks); `runs` names a run in their help ("steps").
void add_timing_options(CLI::App& app, Timing& t, const std::string& iters_flag = "--iters",
                        const std::string& runs = "runs");

class Timer {
public:
  // `device`: where the runs queue their work; `ranks`: the group whose slowest rank times each
  // run (null: this process alone); `whole_device`: a run may leave work on streams other than the
  // current one (a training step's communication stream), so the device is synchronized before the
  // closing event (without it, kernels queued back to back are timed by the events alone, with no
  // host round trip inside the run).
  explicit Timer(Device device = Device::cpu(), parallel::ProcessGroup* ranks = nullptr,
                 bool whole_device = false);

  // Seconds of one run of fn.
  double seconds(const std::function<void()>& fn) const;
  // Seconds of each of t.iters runs of fn, after t.warmup untimed ones.
  std::vector<double> runs(const Timing& t, const std::function<void()>& fn) const;
  double median_seconds(const Timing& t, const std::function<void()>& fn) const {
    return median(runs(t, fn));
  }
  // The median seconds of a and of b, their runs alternating (a, b, a, b, ...), warm-ups included.
  std::pair<double, double> interleaved(const Timing& t, const std::function<void()>& a,
                                        const std::function<void()>& b) const;

private:
  Device device_;
  parallel::ProcessGroup* ranks_;
  bool whole_device_;
  mutable Event start_{true}, end_{true}; // reused: creating CUDA events costs host time
};

} // namespace vlm::bench
