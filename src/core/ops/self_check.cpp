#include "src/core/ops/self_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>

#include "src/base/check.h"
#include "src/base/env.h"
#include "src/base/logging.h"

namespace vlm::ops_detail {

namespace {

struct Decision {
  bool use_kernel = true;
  std::string error; // set: strict mode failed, thrown on every use
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Decision>& cache() {
  static std::map<std::string, Decision> c;
  return c;
}

Decision decide(const std::string& key, double tolerance, const SelfCheckMeasure& measure,
                const char* fallback) {
  const SelfCheckMode mode = self_check_mode();
  if (mode == SelfCheckMode::off) return {};
  if (mode == SelfCheckMode::fallback) {
    log_warn("VLM_GPU_SELF_CHECK=fallback: not using the CUDA kernel for ", key, "; ", fallback,
             " runs");
    return {false, ""};
  }
  double error = INFINITY;
  std::string failure;
  try {
    error = measure();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty() && error <= tolerance) return {}; // false for NaN
  std::ostringstream what;
  what << "GPU self-check failed for " << key << ": ";
  if (failure.empty())
    what << "relative error " << error << " > tolerance " << tolerance;
  else
    what << "the kernel threw: " << failure;
  if (mode == SelfCheckMode::strict) return {false, what.str() + " (VLM_GPU_SELF_CHECK=strict)"};
  log_warn(what.str(), "; using ", fallback, " from now on");
  return {false, ""};
}

} // namespace

SelfCheckMode self_check_mode() {
  const std::string v = env_str("VLM_GPU_SELF_CHECK", "on");
  if (v == "on") return SelfCheckMode::on;
  if (v == "strict") return SelfCheckMode::strict;
  if (v == "off") return SelfCheckMode::off;
  if (v == "fallback") return SelfCheckMode::fallback;
  VLM_FAIL("VLM_GPU_SELF_CHECK must be on, strict, off or fallback, got '", v, "'");
}

bool gpu_kernel_passes(const std::string& key, double tolerance, const SelfCheckMeasure& measure,
                       const char* fallback) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = cache().find(key);
  if (it == cache().end())
    it = cache().emplace(key, decide(key, tolerance, measure, fallback)).first;
  VLM_CHECK(it->second.error.empty(), it->second.error);
  return it->second.use_kernel;
}

double max_rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
      return INFINITY;
    }
    diff = std::max(diff, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return ref > 0 ? diff / ref : diff;
}

} // namespace vlm::ops_detail
