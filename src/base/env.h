// Environment switches (VLM_SYNC, VLM_CHECK_FINITE, VLM_LOG_LEVEL, ...).
#pragma once

#include <cstdint>
#include <string>

namespace vlm {

// The integer value of an environment variable, or `fallback` when unset or empty.
// A value that is not an integer is an error naming the variable.
int64_t env_int(const char* name, int64_t fallback);
std::string env_str(const char* name, const std::string& fallback);

} // namespace vlm
