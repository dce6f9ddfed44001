#include "parallel/watchdog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "src/base/logging.h"

namespace vlm::parallel {

namespace {

using Clock = std::chrono::steady_clock;

struct Watched {
  std::string what;
  Clock::time_point start;
  std::function<bool()> done;         // empty: a blocked wait, removed by its owner
  std::function<std::string()> error; // may be empty
};

double default_timeout() {
  const char* env = std::getenv("VLM_COLLECTIVE_TIMEOUT_S");
  if (!env || !*env) return 600.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  return end && *end == '\0' && v >= 0 ? v : 600.0;
}

std::atomic<double>& timeout_seconds() {
  static std::atomic<double> t{default_timeout()};
  return t;
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

// Never destroyed: the thread may still look at it while the process exits.
struct State {
  std::mutex mutex;
  std::map<long, Watched> watched;
  long next_id = 1;
  bool thread_started = false;

  void start_thread_locked() {
    if (thread_started) return;
    thread_started = true;
    std::thread([this] { run(); }).detach();
  }

  void run() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::lock_guard<std::mutex> lock(mutex);
      const double limit = timeout_seconds().load();
      const auto now = Clock::now();
      for (auto it = watched.begin(); it != watched.end();) {
        Watched& w = it->second;
        if (w.error) {
          const std::string e = w.error();
          if (!e.empty()) die(w.what + " failed: " + e);
        }
        if (w.done && w.done()) {
          it = watched.erase(it);
          continue;
        }
        const double waited = std::chrono::duration<double>(now - w.start).count();
        if (limit > 0 && waited > limit)
          die(detail::str_cat(w.what, " did not finish within ", limit,
                              " s (parallel.collective_timeout_s): a peer rank crashed, hangs or "
                              "skipped it; ending this rank so that the job ends"));
        ++it;
      }
    }
  }
};

State& state() {
  static State* s = new State;
  return *s;
}

} // namespace

void set_collective_timeout(double seconds) { timeout_seconds() = seconds < 0 ? 0 : seconds; }
double collective_timeout() { return timeout_seconds().load(); }

BlockedWait::BlockedWait(std::string what) : id_(0) {
  if (collective_timeout() <= 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  id_ = s.next_id++;
  s.watched.emplace(id_, Watched{std::move(what), Clock::now(), {}, {}});
  s.start_thread_locked();
}

BlockedWait::~BlockedWait() {
  if (id_ == 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.watched.erase(id_);
}

void watch_in_flight(std::string what, std::function<bool()> done,
                     std::function<std::string()> error) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.watched.emplace(s.next_id++,
                    Watched{std::move(what), Clock::now(), std::move(done), std::move(error)});
  s.start_thread_locked();
}

} // namespace vlm::parallel
