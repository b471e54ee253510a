// Files and commands for tests: a scratch folder per test process, whole-file reads, and a shell
// command run with its stdout and stderr captured.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace meshrt::test {

// <base>/meshrt-test-<name>-<pid> (base: <tmp>), created on first use (ctest runs cases as
// parallel processes, so each process gets its own) and removed with everything in it when the
// process exits, so that test runs do not pile up folders in /tmp. MESHRT_TEST_KEEP_FILES=1 keeps
// them for a look after a failure. A forked child leaves them to the process that made them.
inline std::filesystem::path scratch_dir(
    const std::string& name,
    const std::filesystem::path& base = std::filesystem::temp_directory_path()) {
  struct Made {
    const pid_t owner = ::getpid();
    std::mutex mu;
    std::vector<std::filesystem::path> dirs;
    ~Made() {
      const char* keep = std::getenv("MESHRT_TEST_KEEP_FILES");
      if (::getpid() != owner || (keep != nullptr && *keep != '\0' && std::string(keep) != "0"))
        return;
      for (const auto& d : dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    }
  };
  static Made made;
  std::filesystem::path p = base / ("meshrt-test-" + name + "-" + std::to_string(::getpid()));
  std::lock_guard<std::mutex> lk(made.mu);
  if (std::filesystem::create_directories(p)) made.dirs.push_back(p);
  return p;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Run {
  int rc = -1;  // exit status; -1 when killed by a signal
  bool signaled = false;
  std::string out, err;
};

// `s` as one /bin/sh word: in single quotes, each ' written as '\''. For the programs' paths,
// which are the build folder's and so may hold spaces.
inline std::string sh_quote(std::string_view s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` through /bin/sh with stdout and stderr captured in files under `dir` (no shell
// quoting is added: callers quote what needs it, e.g. a program's path with sh_quote).
// MESHRT_COMM_TIMEOUT=60 turns a hang into a failure rather than a stuck test.
inline Run run_shell(const std::string& cmd, const std::filesystem::path& dir) {
  static int n = 0;
  const int id = n++;
  const std::filesystem::path out = dir / ("out" + std::to_string(id) + ".txt");
  const std::filesystem::path err = dir / ("err" + std::to_string(id) + ".txt");
  const std::string full =
      "MESHRT_COMM_TIMEOUT=60 " + cmd + " >" + out.string() + " 2>" + err.string();
  const int st = std::system(full.c_str());
  Run r;
  r.signaled = WIFSIGNALED(st);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Runs the program `bin` (quoted here) with `args` as run_shell does.
inline Run run_program(std::string_view bin, std::string_view args,
                       const std::filesystem::path& dir) {
  std::string cmd = sh_quote(bin);
  cmd.append(" ").append(args);
  return run_shell(cmd, dir);
}

}  // namespace meshrt::test
