#include "tools/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "runtime/error.h"

namespace meshrt::cli {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_announce{false};
struct sigaction g_old_int {
}, g_old_term{};

// Only async-signal-safe calls here: atomics, write, _exit.
void say(const char* s, size_t n) {
  if (g_announce.load()) (void)!write(STDERR_FILENO, s, n);
}

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    static const char kFirst[] =
        "\nmeshrt: stopping after the current step (signal again to exit at once)\n";
    say(kFirst, sizeof kFirst - 1);
    return;
  }
  static const char kSecond[] = "\nmeshrt: second signal: exiting now\n";
  say(kSecond, sizeof kSecond - 1);
  _exit(128 + sig);
}

}  // namespace

StopSignals::StopSignals(bool announce) {
  g_signal.store(0);
  g_announce.store(announce);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Blocking calls (collectives, file I/O) resume rather than fail with EINTR.
  sa.sa_flags = SA_RESTART;
  MESHRT_CHECK(sigaction(SIGINT, &sa, &g_old_int) == 0 && sigaction(SIGTERM, &sa, &g_old_term) == 0,
               "cannot install the SIGINT / SIGTERM handlers");
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopSignals::received() { return g_signal.load(); }

const char* StopSignals::name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace meshrt::cli
