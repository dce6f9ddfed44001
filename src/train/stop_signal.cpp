#include "src/train/stop_signal.h"

#include <atomic>
#include <csignal>

#include "src/base/check.h"

namespace vlm::train {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
struct sigaction g_old_term, g_old_int, g_old_usr1;

void on_signal(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig)) { // the second one: stop now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

} // namespace

StopSignals::StopSignals() {
  VLM_CHECK(!g_installed.exchange(true), "StopSignals: already installed");
  g_signal = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; // reads and waits in the loader threads carry on
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  g_installed = false;
}

int StopSignals::received() { return g_signal.load(); }

} // namespace vlm::train
