// The main() of every benchmark: its options bound to a CLI::App (src/cli/args.h; --help prints
// them with their types and defaults), then
//   return bench::run_main(app, argc, argv, [&] { return run(options); });
// which parses argv (a bad value is an error naming the option), runs the benchmark, and prints
// an error as "error: ..." (after "[rank r/W] " in a job of several ranks) with exit code 1.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>

#include "src/base/logging.h"
#include "src/cli/args.h"

namespace vlm::bench {

// Parses argv into the options bound to `app` and returns run()'s exit code: 0 after --help;
// 1 after an error (printed), once `on_error(1)` has run where given (the MPI benchmarks pass
// parallel::abort_job_if_parallel, so that no peer waits in a collective for the failed rank).
inline int run_main(CLI::App& app, int argc, char** argv, const std::function<int()>& run,
                    void (*on_error)(int) = nullptr) {
  try {
    return cli::parse_args(app, argc, argv) ? run() : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
    if (on_error) on_error(1);
    return 1;
  }
}

} // namespace vlm::bench
