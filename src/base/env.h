// Environment switches (VLM_SYNC, VLM_CHECK_FINITE, VLM_LOG_LEVEL, ...) and facts of the machine.
#pragma once

#include <cstdint>
#include <string>

namespace vlm {

// The integer value of an environment variable, or `fallback` when unset or empty.
// A value that is not an integer is an error naming the variable.
int64_t env_int(const char* name, int64_t fallback);
std::string env_str(const char* name, const std::string& fallback);

// This machine's physical memory in bytes (0 when it cannot be read): what host allocations sized
// by a file are checked against before they are made.
int64_t physical_memory_bytes();

// This process's peak resident set size so far in bytes (VmHWM of /proc/self/status; 0 where
// that cannot be read): what a host memory target is measured by.
int64_t peak_rss_bytes();

} // namespace vlm
