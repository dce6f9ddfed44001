// The message of the vlm::Error that f() throws, or "" when it throws none: for tests that check
// that an error names the file, key or shape at fault.
#pragma once

#include <string>

#include "src/base/check.h"

namespace vlm::testing {

template <typename F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "";
}

} // namespace vlm::testing
