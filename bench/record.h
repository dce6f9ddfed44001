// The common record of every benchmark (issue 36): one JSON line per measurement,
//   {"benchmark", "case", "mesh", "device", "metric", "value", "reference", "ratio", "commit"}
// printed to stdout and, when the environment names a file in VLM_BENCH_RECORDS, appended to it
// (a sweep collects its records there; tools/scaling and tools/report read them). "reference" is
// the same metric of the side-by-side reference run (null without one), "ratio" value / reference.
// bench/records.py writes the same record from the benchmark scripts.
#pragma once

#include <optional>
#include <string>

namespace vlm::bench {

struct Record {
  std::string benchmark;  // the executable or script: "bench_fsdp_step"
  std::string case_name;  // what was measured: "allreduce 4 MiB", "qwen3 hidden 256 x 4"
  std::string mesh = "1"; // ranks and layout: "4 ranks: dp_replicate 1 x dp_shard 4 x tp 1"
  std::string device;     // "cpu" or "cuda:0 (NVIDIA H100 ...)"
  std::string metric;     // with its unit: "step_ms", "tokens_per_s", "bus_GBps"
  double value = 0;
  std::optional<double> reference; // the reference run's value of the same metric
};

// Prints the record to stdout and appends it to $VLM_BENCH_RECORDS when that is set (an error
// naming the file when it cannot be written).
void emit(const Record& r);
inline void emit(const std::string& benchmark, const std::string& case_name,
                 const std::string& mesh, const std::string& device, const std::string& metric,
                 double value, std::optional<double> reference = {}) {
  emit(Record{benchmark, case_name, mesh, device, metric, value, reference});
}

// The commit the benchmark was built from ("unknown" outside a git checkout; "+dirty" when the
// tree had changes at build time).
const char* build_commit();

} // namespace vlm::bench
