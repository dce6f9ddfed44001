#include "src/base/check.h"

namespace vlm::detail {

void throw_error(const char* file, int line, const char* cond, const std::string& msg) {
  std::ostringstream os;
  os << msg;
  os << " [" << file << ":" << line;
  if (cond) os << ", check failed: " << cond;
  os << "]";
  throw Error(os.str());
}

} // namespace vlm::detail
