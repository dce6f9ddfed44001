#include "src/base/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "src/base/env.h"

namespace vlm {

namespace {
std::atomic<int> g_rank{0};
std::atomic<int> g_world{1};
std::atomic<int> g_level{-1};
std::mutex g_mutex;

int current_level() {
  int l = g_level.load();
  if (l < 0) {
    l = int(env_int("VLM_LOG_LEVEL", int(LogLevel::info)));
    g_level = l;
  }
  return l;
}
} // namespace

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
int log_rank() { return g_rank; }
int log_world_size() { return g_world; }
void set_log_level(LogLevel level) { g_level = int(level); }

std::string rank_prefix() {
  if (g_world <= 1) return "";
  return "[rank " + std::to_string(g_rank.load()) + "/" + std::to_string(g_world.load()) + "] ";
}

void log_line(LogLevel level, const std::string& msg) {
  if (int(level) < current_level()) return;
  static const char* tags[] = {"debug: ", "", "warning: ", "error: "};
  std::lock_guard<std::mutex> lock(g_mutex);
  FILE* out = level >= LogLevel::warn ? stderr : stdout;
  std::fprintf(out, "%s%s%s\n", rank_prefix().c_str(), tags[int(level)], msg.c_str());
  std::fflush(out);
}

} // namespace vlm
