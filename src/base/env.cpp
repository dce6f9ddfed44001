#include "src/base/env.h"

#include <cstdlib>

#include "src/base/check.h"

namespace vlm {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  VLM_CHECK(end && *end == '\0', "environment variable ", name, "='", v, "' is not an integer");
  return x;
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

} // namespace vlm
