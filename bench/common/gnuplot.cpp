#include "bench/common/gnuplot.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "runtime/stop.h"

extern char** environ;

namespace meshrt::bench {

namespace {

// The private folder of one plot, removed with everything in it however the plot ends.
struct GpFolder {
  std::filesystem::path dir;
  ~GpFolder() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// gnuplot on `script`, its output to `log`: its exit status (127 when it cannot be started). The
// wait ends early, gnuplot killed and the folder left to GpFolder, at a stop request (SIGINT /
// SIGTERM: runtime/stop.h) or after MESHRT_PLOT_TIMEOUT seconds (a gnuplot that never exits, e.g.
// one waiting for a terminal).
int gp_run(const std::string& script, const std::string& log, const std::string& flag) {
  const int64_t timeout_s = env_int("MESHRT_PLOT_TIMEOUT", 60);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&fa, STDERR_FILENO, STDOUT_FILENO);
  // Every signal at its default (this process may ignore SIGPIPE and SIGXFSZ), none blocked. It
  // stays in this process group, so a Ctrl-C at the terminal reaches it too.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&at, &all);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  std::string arg0 = "gnuplot", arg1 = script;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  const int rc = posix_spawnp(&pid, "gnuplot", &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) return 127;  // not on PATH
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    int st = 0;
    const pid_t w = ::waitpid(pid, &st, WNOHANG);
    if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (w < 0 && errno != EINTR) return 127;
    const int sig = stop_request();
    if (sig != 0 || clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      MESHRT_CHECK(sig == 0, flag << ": stopped by "
                                  << (sig == SIGINT    ? "SIGINT"
                                      : sig == SIGTERM ? "SIGTERM"
                                      : sig == SIGHUP  ? "SIGHUP"
                                                       : "signal " + std::to_string(sig))
                                  << " while gnuplot drew the plot; nothing was written");
      MESHRT_FAIL(flag << ": gnuplot did not finish within " << timeout_s
                       << " s (MESHRT_PLOT_TIMEOUT) and was stopped; nothing was written. Check "
                          "that `gnuplot` on PATH runs a script without a terminal, or raise "
                          "MESHRT_PLOT_TIMEOUT");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string gp_slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::string gp_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) {
    o += c;
    if (c == '\'') o += '\'';
  }
  return o + "'";
}

void render_gnuplot(const std::string& path, const GnuplotJob& job) {
  namespace fs = std::filesystem;
  static std::atomic<int> serial{0};
  GpFolder folder{fs::temp_directory_path() /
                  ("meshrt-plot-" + std::to_string(getpid()) + "-" + std::to_string(serial++))};
  const fs::path& dir = folder.dir;
  fs::create_directories(dir);
  const fs::path gp = dir / "plot.gp", png = dir / "plot.png";
  for (const auto& [name, text] : job.data) std::ofstream(dir / name, std::ios::binary) << text;
  auto script = [&](const char* term) {
    std::ofstream g(gp);
    g << "set terminal " << term << " size " << job.width << "," << job.height << " font \",10\"\n"
      << "set output " << gp_quote(png.string()) << "\n"
      << job.body(dir.string() + "/");
  };
  script("pngcairo");
  const std::string log = (dir / "gnuplot.err").string();
  int rc = gp_run(gp.string(), log, job.flag);
  if (rc != 0 && rc != 127) {  // no cairo: the libgd terminal
    script("png");
    rc = gp_run(gp.string(), log, job.flag);
  }
  const std::string err = gp_slurp(log);
  // gnuplot writes into the private folder; the plot reaches `path` as every output does.
  const std::string image = rc == 0 ? gp_slurp(png) : std::string();
  MESHRT_CHECK(rc == 0 && !image.empty(),
               job.flag << ": gnuplot failed (exit " << rc << (rc == 127 ? ": not found" : "")
                        << ")" << (err.empty() ? "" : ": " + err)
                        << "; install gnuplot (Debian: gnuplot-nox, tools/install-deps.sh does "
                           "it) or drop "
                        << job.flag);
  write_output_file(path, image, job.flag);
}

}  // namespace meshrt::bench
