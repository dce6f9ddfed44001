#include "src/train/fault_injection.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "src/base/check.h"
#include "src/base/logging.h"

namespace vlm::train {

namespace {

struct Name {
  const char* text;
  FaultInjection::Kind kind;
};
constexpr Name kKinds[] = {{"error", FaultInjection::Kind::error},
                           {"crash", FaultInjection::Kind::crash},
                           {"kill", FaultInjection::Kind::kill},
                           {"hang", FaultInjection::Kind::hang},
                           {"signal", FaultInjection::Kind::signal}};
struct PointName {
  const char* text;
  FaultInjection::Point point;
};
constexpr PointName kPoints[] = {{"step", FaultInjection::Point::step},
                                 {"save-writing", FaultInjection::Point::save_writing},
                                 {"save-closed", FaultInjection::Point::save_closed},
                                 {"save-renamed", FaultInjection::Point::save_renamed}};

const char* kind_text(FaultInjection::Kind k) {
  for (const Name& n : kKinds)
    if (n.kind == k) return n.text;
  return "?";
}

const char* point_text(FaultInjection::Point p) {
  for (const PointName& n : kPoints)
    if (n.point == p) return n.text;
  return "?";
}

} // namespace

FaultInjection parse_fault_injection(const std::string& text) {
  // An empty value (`--inject-fault ""`, or a variable that was not set) asked for a fault:
  // refused, never read as "no fault".
  VLM_CHECK(text.find_first_not_of(" \t\n\r") != std::string::npos, "--inject-fault \"", text,
            "\": empty; expected KIND:RANK:STEP[:POINT] (e.g. signal:0:4) with KIND error, crash, "
            "kill, hang or signal, RANK >= 0, STEP >= 1 and POINT step, save-writing, save-closed "
            "or save-renamed");
  std::vector<std::string> parts;
  for (size_t begin = 0;;) {
    const size_t end = text.find(':', begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  FaultInjection f;
  bool ok = parts.size() == 3 || parts.size() == 4;
  if (ok) {
    char* end = nullptr;
    errno = 0;
    const long long rank = std::strtoll(parts[1].c_str(), &end, 10);
    ok = !parts[1].empty() && *end == '\0' && errno == 0 && rank >= 0 && rank <= INT32_MAX;
    f.rank = ok ? int(rank) : 0;
    errno = 0;
    f.step = std::strtoll(parts[2].c_str(), &end, 10);
    ok = ok && !parts[2].empty() && *end == '\0' && errno == 0 && f.step >= 1;
    bool kind_ok = false, point_ok = parts.size() == 3;
    for (const Name& n : kKinds)
      if (parts[0] == n.text) f.kind = n.kind, kind_ok = true;
    for (const PointName& n : kPoints)
      if (parts.size() == 4 && parts[3] == n.text) f.point = n.point, point_ok = true;
    ok = ok && kind_ok && point_ok;
  }
  VLM_CHECK(ok,
            "--inject-fault expects KIND:RANK:STEP[:POINT] with KIND error, crash, kill, hang or "
            "signal, RANK >= 0, STEP >= 1 and POINT step, save-writing, save-closed or "
            "save-renamed, got '",
            text, "'");
  return f;
}

void check_fault_injection(const FaultInjection& fault, int world_size, int64_t first_step,
                           int64_t total_steps, int64_t save_steps) {
  if (fault.kind == FaultInjection::Kind::none) return;
  const std::string what = "--inject-fault " + std::string(kind_text(fault.kind)) + ":" +
                           std::to_string(fault.rank) + ":" + std::to_string(fault.step) + ":" +
                           point_text(fault.point);
  VLM_CHECK(fault.rank < world_size, what, " can never fire: rank ", fault.rank,
            " is not in this job of ", world_size, " rank(s)");
  VLM_CHECK(fault.step > first_step && fault.step <= total_steps, what,
            " can never fire: this run trains steps ", first_step + 1, " to ", total_steps);
  const bool saves = fault.step == total_steps || (save_steps > 0 && fault.step % save_steps == 0);
  VLM_CHECK(fault.point == FaultInjection::Point::step || saves, what, " can never fire: step ",
            fault.step, " saves no checkpoint (checkpoint.save_steps = ", save_steps,
            ", total_steps = ", total_steps, ")");
}

void trigger_fault(const FaultInjection& fault, int rank, int64_t step,
                   FaultInjection::Point point) {
  if (fault.kind == FaultInjection::Kind::none || fault.rank != rank || fault.step != step ||
      fault.point != point)
    return;
  std::fprintf(stderr, "%sinjected fault at step %lld, %s (--inject-fault)\n",
               rank_prefix().c_str(), (long long)step, point_text(point));
  std::fflush(stderr);
  switch (fault.kind) {
  case FaultInjection::Kind::error:
    VLM_FAIL("train step ", step, ": injected error on rank ", rank, " at ", point_text(point),
             " (--inject-fault)");
  case FaultInjection::Kind::crash: std::abort();
  case FaultInjection::Kind::kill: std::raise(SIGKILL); break;
  case FaultInjection::Kind::hang:
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  case FaultInjection::Kind::signal: std::raise(SIGUSR1); break;
  case FaultInjection::Kind::none: break;
  }
}

} // namespace vlm::train
