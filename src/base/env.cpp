#include "src/base/env.h"

#include <cstdlib>
#include <fstream>

#include <unistd.h>

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

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0)
      return int64_t(std::strtoll(line.c_str() + 6, nullptr, 10)) * 1024;
  return 0;
}

} // namespace vlm
