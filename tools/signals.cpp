#include "tools/signals.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "runtime/error.h"
#include "runtime/stop.h"

namespace meshrt::cli {

namespace {

std::atomic<bool> g_announce{false};
std::atomic<bool> g_watch_stdout{false};
struct sigaction g_old_int {
}, g_old_term{}, g_old_usr2{}, g_old_hup{}, g_old_pipe{};

// The reader of standard output is gone: a pipe whose read end was closed (`| head -1` after its
// line), where the next write fails with EPIPE.
bool stdout_reader_gone() {
  pollfd p{STDOUT_FILENO, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0;
}

// SIGHUP (the terminal closed, the ssh session dropped) is handled as SIGTERM is, unless it is
// ignored (`nohup`, a launcher that detached the job): then it stays ignored, as asked. Installs
// `sa` for it (saving the previous action in *old) when it is not ignored.
bool install_hangup(const struct sigaction& sa, struct sigaction* old) {
  if (sigaction(SIGHUP, nullptr, old) != 0) return false;
  if (old->sa_handler == SIG_IGN && !(old->sa_flags & SA_SIGINFO)) return true;
  return sigaction(SIGHUP, &sa, nullptr) == 0;
}

// Only async-signal-safe calls here: atomics, write, _exit.
void say(const char* s, size_t n) {
  if (g_announce.load()) (void)!write(STDERR_FILENO, s, n);
}

extern "C" void on_stop_signal(int sig) {
  if (stop_request() == 0) {
    request_stop(sig);
    static const char kFirst[] =
        "\nmeshrt: stopping after the current step (signal again to exit at once)\n";
    say(kFirst, sizeof kFirst - 1);
    return;
  }
  static const char kSecond[] = "\nmeshrt: second signal: exiting now\n";
  say(kSecond, sizeof kSecond - 1);
  _exit(128 + sig);
}

// ExitOnSignal's line, composed before the handler is installed: "<command>: interrupted by ".
char g_exit_prefix[256];
size_t g_exit_prefix_len = 0;
timespec g_exit_start{};
struct sigaction g_exit_old_int {
}, g_exit_old_term{}, g_exit_old_hup{};

// Appends `v` in decimal to buf at *n (async-signal-safe).
void put_uint(char* buf, size_t cap, size_t* n, unsigned long long v) {
  char digits[24];
  int k = 0;
  do {
    digits[k++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && k < 24);
  while (k > 0 && *n < cap) buf[(*n)++] = digits[--k];
}

void put_str(char* buf, size_t cap, size_t* n, const char* s) {
  while (*s != '\0' && *n < cap) buf[(*n)++] = *s++;
}

extern "C" void on_exit_signal(int sig) {
  char line[512];
  size_t n = 0;
  for (size_t i = 0; i < g_exit_prefix_len && n < sizeof line; ++i) line[n++] = g_exit_prefix[i];
  put_str(line, sizeof line, &n,
          sig == SIGINT    ? "SIGINT"
          : sig == SIGTERM ? "SIGTERM"
          : sig == SIGHUP  ? "SIGHUP"
                           : "a signal");
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long long ms = (now.tv_sec - g_exit_start.tv_sec) * 1000LL +
                       (now.tv_nsec - g_exit_start.tv_nsec) / 1000000LL;
  put_str(line, sizeof line, &n, " after ");
  put_uint(line, sizeof line, &n, static_cast<unsigned long long>(ms < 0 ? 0 : ms) / 1000);
  put_str(line, sizeof line, &n, ".");
  put_uint(line, sizeof line, &n, static_cast<unsigned long long>(ms < 0 ? 0 : ms) % 1000 / 100);
  put_str(line, sizeof line, &n, " s; its --json / --trace / --dump files were not written\n");
  if (g_announce.load()) (void)!write(STDERR_FILENO, line, n);
  _exit(128 + sig);
}

}  // namespace

ExitOnSignal::ExitOnSignal(const std::string& command, bool announce) {
  g_announce.store(announce);
  std::string prefix = "\n";  // append: GCC 12's -O3 misreads "literal" + string (-Wrestrict)
  prefix.append(command, 0, 200).append(": interrupted by ");
  std::memcpy(g_exit_prefix, prefix.data(), prefix.size());
  g_exit_prefix_len = prefix.size();
  clock_gettime(CLOCK_MONOTONIC, &g_exit_start);
  struct sigaction sa {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  MESHRT_CHECK(sigaction(SIGINT, &sa, &g_exit_old_int) == 0 &&
                   sigaction(SIGTERM, &sa, &g_exit_old_term) == 0 &&
                   install_hangup(sa, &g_exit_old_hup),
               "cannot install the SIGINT / SIGTERM / SIGHUP handlers: " << std::strerror(errno));
}

ExitOnSignal::~ExitOnSignal() {
  sigaction(SIGINT, &g_exit_old_int, nullptr);
  sigaction(SIGTERM, &g_exit_old_term, nullptr);
  sigaction(SIGHUP, &g_exit_old_hup, nullptr);
}

StopSignals::StopSignals(bool announce) {
  clear_stop_request();
  set_graceful_stop(true);
  g_announce.store(announce);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Blocking calls (collectives, file I/O) resume rather than fail with EINTR.
  sa.sa_flags = SA_RESTART;
  // SIGPIPE ignored: a write to a closed pipe fails with EPIPE instead of killing the process,
  // and received() turns the closed pipe into a stop request (SIGPIPE) at the next safe point.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  MESHRT_CHECK(sigaction(SIGINT, &sa, &g_old_int) == 0 &&
                   sigaction(SIGTERM, &sa, &g_old_term) == 0 &&
                   sigaction(SIGUSR2, &sa, &g_old_usr2) == 0 && install_hangup(sa, &g_old_hup) &&
                   sigaction(SIGPIPE, &ign, &g_old_pipe) == 0,
               "cannot install the SIGINT / SIGTERM / SIGUSR2 / SIGHUP / SIGPIPE handlers: "
                   << std::strerror(errno));
  g_watch_stdout.store(true);
}

StopSignals::~StopSignals() {
  g_watch_stdout.store(false);
  set_graceful_stop(false);
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR2, &g_old_usr2, nullptr);
  sigaction(SIGHUP, &g_old_hup, nullptr);
  sigaction(SIGPIPE, &g_old_pipe, nullptr);
}

int StopSignals::received() {
  if (stop_request() == 0 && g_watch_stdout.load() && stdout_reader_gone()) request_stop(SIGPIPE);
  return stop_request();
}

const char* StopSignals::name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE (standard output was closed by its reader)";
    default:
      return "a signal";
  }
}

}  // namespace meshrt::cli
