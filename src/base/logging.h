// Logging with a rank prefix: "[rank r/W] message". Rank 0 output can be selected with
// log_rank0. The rank is set once by the process-group setup (or stays 0/1).
#pragma once

#include <string>

#include "src/base/check.h"

namespace vlm {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

void set_log_rank(int rank, int world_size);
int log_rank();
int log_world_size();
void set_log_level(LogLevel level);
void log_line(LogLevel level, const std::string& msg);
// "[rank r/W] " or "" when the world has one rank.
std::string rank_prefix();

template <typename... Args> void log_info(const Args&... args) {
  log_line(LogLevel::info, detail::str_cat(args...));
}
template <typename... Args> void log_warn(const Args&... args) {
  log_line(LogLevel::warn, detail::str_cat(args...));
}
template <typename... Args> void log_debug(const Args&... args) {
  log_line(LogLevel::debug, detail::str_cat(args...));
}
template <typename... Args> void log_rank0(const Args&... args) {
  if (log_rank() == 0) log_line(LogLevel::info, detail::str_cat(args...));
}

} // namespace vlm
