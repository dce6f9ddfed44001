#include "src/base/check.h"

#include <cstring>

namespace vlm::detail {

namespace {

// `file` is __FILE__, the path the build gave the compiler: inside the repository it is said
// relative to it ("io/state/safetensors.cpp"), which reads the same on every machine.
const char* repository_path(const char* file) {
  static constexpr char root[] = VLM_SOURCE_ROOT;
  return std::strncmp(file, root, sizeof root - 1) == 0 ? file + sizeof root - 1 : file;
}

} // namespace

void throw_error(const char* file, int line, const char* cond, const std::string& msg) {
  std::ostringstream os;
  os << msg;
  os << " [" << repository_path(file) << ":" << line;
  if (cond) os << ", check failed: " << cond;
  os << "]";
  throw Error(os.str());
}

} // namespace vlm::detail
