// SIGINT / SIGTERM for long commands: the first asks the command to stop at its next safe point
// (`meshrt train`: after the current step; runtime/stop.h, which also ends a file-rendezvous wait
// at once), a second exits at once. SIGUSR2 does the same: Open MPI's mpirun forwards it to every
// rank at once, where it turns SIGINT / SIGTERM into SIGTERM only after
// odls_base_sigkill_timeout seconds (and SIGKILL as long after that). SIGHUP (the terminal
// closed, the ssh session dropped) is handled as SIGTERM, as torchrun's elastic agent does,
// unless the process was started with it ignored (`nohup`): then it stays ignored.
#pragma once

#include <string>

namespace meshrt::cli {

// Installs the handlers while it lives and restores the previous ones after. One at a time.
class StopSignals {
 public:
  // `announce`: this process says on stderr that it is stopping (launcher rank 0 only, so an
  // mpirun job prints it once).
  explicit StopSignals(bool announce);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received (SIGINT, SIGTERM, SIGUSR2 or SIGHUP), 0 when none. While a
  // StopSignals lives SIGPIPE is ignored, and standard output found closed by its reader (a pipe
  // to `head` that exited) counts as SIGPIPE received: the command stops as for SIGTERM, and
  // says so on stderr (its standard output is gone).
  static int received();
  // "SIGINT", "SIGTERM", "SIGUSR2", "SIGHUP", "SIGPIPE (standard output was closed by its reader)"
  static const char* name(int sig);
};

// SIGINT / SIGTERM / SIGHUP (unless ignored, as above) for commands with no safe point to stop at
// (benchmarks): the signal ends the
// process at once with one summary line on stderr, "meshrt bench collective: interrupted by SIGINT
// after 12.3 s; its --json / --trace / --dump files were not written", and exit status 128 + the
// signal's number. `announce` as for StopSignals. One at a time; not with StopSignals.
class ExitOnSignal {
 public:
  ExitOnSignal(const std::string& command, bool announce);
  ~ExitOnSignal();
  ExitOnSignal(const ExitOnSignal&) = delete;
  ExitOnSignal& operator=(const ExitOnSignal&) = delete;
};

}  // namespace meshrt::cli
