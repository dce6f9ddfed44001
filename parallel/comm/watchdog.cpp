#include "parallel/comm/watchdog.h"

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

// The one watched blocked wait: set by BlockedWait, read by the thread. `since_ns` (0 = none) is
// written last on entry and first on exit; the fields describe it meanwhile.
struct BlockedSlot {
  std::atomic<int64_t> since_ns{0};
  std::atomic<const char*> op{nullptr};
  std::atomic<int64_t> numel{0};
  std::atomic<DType> dtype{DType::f32};
  std::atomic<const std::string*> group{nullptr};
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Never destroyed: the thread may still look at it while the process exits.
struct State {
  std::mutex mutex;
  std::map<long, Watched> watched;
  long next_id = 1;
  std::atomic<bool> thread_started{false};
  BlockedSlot blocked;

  void start_thread() {
    if (thread_started.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex);
    if (thread_started.load()) return;
    std::thread([this] { run(); }).detach();
    thread_started.store(true, std::memory_order_release);
  }

  // Ends the process when the blocked wait has lasted longer than `limit` seconds.
  void check_blocked(double limit) {
    const int64_t since = blocked.since_ns.load(std::memory_order_acquire);
    if (since == 0 || limit <= 0 || double(now_ns() - since) * 1e-9 <= limit) return;
    const char* op = blocked.op.load();
    const std::string* group = blocked.group.load();
    const int64_t numel = blocked.numel.load();
    const DType dtype = blocked.dtype.load();
    if (blocked.since_ns.load(std::memory_order_acquire) != since) return; // it just finished
    die(detail::str_cat(op ? op : "a collective", " of ", numel, " ", dtype_name(dtype),
                        " elements on ", group ? *group : std::string("a process group"),
                        " did not finish within ", limit,
                        " s (parallel.collective_timeout_s): a peer rank crashed, hangs or skipped "
                        "it; ending this rank so that the job ends"));
  }

  void run() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const double limit = timeout_seconds().load();
      check_blocked(limit);
      std::lock_guard<std::mutex> lock(mutex);
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

BlockedWait::BlockedWait(const char* op, int64_t numel, DType dtype, const std::string& group) {
  if (collective_timeout() <= 0) return;
  State& s = state();
  if (s.blocked.since_ns.load(std::memory_order_relaxed) != 0) return; // nested: not watched
  s.start_thread();
  s.blocked.op = op;
  s.blocked.numel = numel;
  s.blocked.dtype = dtype;
  s.blocked.group = &group;
  s.blocked.since_ns.store(now_ns(), std::memory_order_release);
  owner_ = true;
}

BlockedWait::~BlockedWait() {
  if (owner_) state().blocked.since_ns.store(0, std::memory_order_release);
}

void watch_in_flight(std::string what, std::function<bool()> done,
                     std::function<std::string()> error) {
  State& s = state();
  s.start_thread();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.watched.emplace(s.next_id++,
                    Watched{std::move(what), Clock::now(), std::move(done), std::move(error)});
}

} // namespace vlm::parallel
