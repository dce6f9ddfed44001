#include "src/train/fault_injection.h"

#include <chrono>
#include <csignal>
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

const char* point_text(FaultInjection::Point p) {
  for (const PointName& n : kPoints)
    if (n.point == p) return n.text;
  return "?";
}

} // namespace

FaultInjection parse_fault_injection(const std::string& text) {
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
    f.rank = int(std::strtol(parts[1].c_str(), &end, 10));
    ok = !parts[1].empty() && *end == '\0' && f.rank >= 0;
    f.step = std::strtoll(parts[2].c_str(), &end, 10);
    ok = ok && !parts[2].empty() && *end == '\0' && f.step >= 1;
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
