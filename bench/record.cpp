#include "bench/record.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench_commit.h" // generated at build time by bench/commit.cmake
#include "src/base/check.h"

namespace vlm::bench {

const char* build_commit() { return VLM_BENCH_COMMIT; }

namespace {

// The record's JSON line (without the newline).
std::string record_json(const Record& r) {
  nlohmann::ordered_json j;
  j["benchmark"] = r.benchmark;
  j["case"] = r.case_name;
  j["mesh"] = r.mesh;
  j["device"] = r.device;
  j["metric"] = r.metric;
  j["value"] = r.value;
  j["reference"] = r.reference ? nlohmann::ordered_json(*r.reference) : nlohmann::ordered_json();
  j["ratio"] = r.reference && *r.reference != 0 ? nlohmann::ordered_json(r.value / *r.reference)
                                                : nlohmann::ordered_json();
  j["commit"] = build_commit();
  return j.dump();
}

} // namespace

void emit(const Record& r) {
  const std::string line = record_json(r);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  const char* path = std::getenv("VLM_BENCH_RECORDS");
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
  VLM_CHECK(out.good(), "benchmark records: cannot append to VLM_BENCH_RECORDS=", path);
}

} // namespace vlm::bench
