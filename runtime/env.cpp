#include "runtime/env.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

// Text: a free-form value (a path, an id, a spec) that its reader parses and checks; Tool: a
// variable of meshrt's own scripts and tests (tools/gpu-check.sh, tests/), never read by the
// library. Both are listed so that every MESHRT_ name meshrt knows is in this one table: a name
// that is not gets a warning (warn_unknown_environment).
enum class Kind { Switch, Choice, Int, Text, Tool };

// One MESHRT_ environment variable: its kind, and its values where they are a fixed set.
struct Variable {
  const char* name;
  Kind kind;
  // Choice: the accepted values, the first is the default; Text: the default (compared across
  // ranks for an unset variable), when it has one
  std::vector<std::string> choices;
  int64_t lo = 0, hi = 0;  // Int: the bounds
  bool on = false;         // Switch: its default
  // Every rank of a launch must have the same value: it changes which collectives run or the
  // numbers the ranks compute (env_rank_shared_settings).
  bool shared = false;
};

Variable shared(Variable v) {
  v.shared = true;
  return v;
}

Variable on_off(const char* name, bool on = false) { return {name, Kind::Switch, {}, 0, 0, on}; }
Variable one_of(const char* name, std::vector<std::string> choices) {
  return {name, Kind::Choice, std::move(choices), 0, 0, false};
}
Variable whole(const char* name, int64_t lo, int64_t hi) {
  return {name, Kind::Int, {}, lo, hi, false};
}
Variable text(const char* name, const char* fallback = "") {
  return {name, Kind::Text, {fallback}, 0, 0, false};
}
Variable tool(const char* name) { return {name, Kind::Tool, {}, 0, 0, false}; }

// Every MESHRT_ variable meshrt reads (docs/environment.md), and its scripts'.
const std::vector<Variable>& table() {
  static const std::vector<Variable> t = {
      on_off("MESHRT_STREAM_JITTER"),
      on_off("MESHRT_LAUNCH_BLOCKING"),
      on_off("MESHRT_HOST_STREAM_REUSE", true),
      shared(on_off("MESHRT_COMM_DEBUG")),
      on_off("MESHRT_FLIGHT_ON_EXIT"),
      on_off("MESHRT_BLAS_REEXEC", true),
      shared(on_off("MESHRT_CUBLAS_TF32")),
      // shm ranks take large host blocks from shared memory, collectives run on them in place.
      on_off("MESHRT_SHM_ZERO_COPY", true),
      shared(one_of("MESHRT_HOST_BF16_GEMM", {"auto", "f32"})),
      shared(one_of("MESHRT_HOST_F16_GEMM", {"auto", "f32"})),
      shared(one_of("MESHRT_HOST_F32_GEMM", {"auto", "openblas", "onednn", "bf16"})),
      shared(one_of("MESHRT_ATTENTION", {"flash", "reference"})),
      shared(one_of("MESHRT_NCCL_HALF_REDUCE", {"f32", "native"})),
      one_of("MESHRT_HOST_BIND", {"auto", "none"}),
      whole("MESHRT_HOST_SPIN", 0, 1000000000),
      whole("MESHRT_HOST_YIELD_US", 0, 1000000000),
      whole("MESHRT_HOST_POLL_US", 0, 1000000),
      whole("MESHRT_HOST_THREADS", 1, 4096),
      whole("MESHRT_FLIGHT", 0, 1000000),
      // Simulated nodes: ranks with the same value share a node (default: the host name).
      whole("MESHRT_NODE_ID", 0, 1000000),
      // report / sweep / tune --plot: seconds gnuplot may take (bench/common/gnuplot.cpp).
      whole("MESHRT_PLOT_TIMEOUT", 1, 86400),
      // Free-form: each reader checks its own (MESHRT_LOG_LEVEL also check_environment).
      text("MESHRT_LOG_LEVEL", "warn"),
      // The host loop variant: FMA or not changes the numbers the ranks compute.
      shared(text("MESHRT_HOST_ISA", "auto")),
      text("MESHRT_BACKEND_PATH"),
      // Read by the Python package (python/meshrt/_capi.py), not by the library.
      text("MESHRT_LIBRARY"),
      text("MESHRT_COMM_TIMEOUT"),
      text("MESHRT_RENDEZVOUS"),
      // The tcp backend's interface (collectives/tcp_comm.cpp); nodes may name theirs apart.
      text("MESHRT_SOCKET_IFNAME"),
      text("MESHRT_RUN_ID"),
      text("MESHRT_FAULT"),
      // Collective algorithms forced over the table's (collectives/algorithms/): which run.
      shared(text("MESHRT_ALGO")),
      text("MESHRT_FLIGHT_DIR"),
      // A test hook of train/checkpoint.cpp: a rank fails while it writes a checkpoint.
      text("MESHRT_CHECKPOINT_FAULT"),
      // meshrt's scripts and tests: tools/gpu-check.sh, examples/python/torchrun.sh,
      // tests/install, tests/common/files.h (keep the tests' scratch folders), .ci/run.
      tool("MESHRT_GPU_BUILD"),
      tool("MESHRT_GPU_CHECK_STOP"),
      tool("MESHRT_GPU_DEADLINE"),
      tool("MESHRT_TORCH_PYTHON"),
      tool("MESHRT_CONSUMER_FLAGS"),
      tool("MESHRT_TEST_KEEP_FILES"),
      tool("MESHRT_CI_SANITIZERS"),
  };
  return t;
}

const Variable& lookup(const char* name, Kind kind) {
  for (const Variable& v : table())
    if (std::string(v.name) == name && v.kind == kind) return v;
  MESHRT_FAIL("internal: environment variable " << name
                                                << " is not described in runtime/env.cpp's table");
}

}  // namespace

bool env_switch(const char* name) {
  const Variable& var = lookup(name, Kind::Switch);
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return var.on;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  MESHRT_FAIL(name << "='" << v << "' is not a switch: use 1 (or true, on, yes) or 0 (or false, "
                   << "off, no), or unset it (" << (var.on ? "on" : "off") << ")");
}

std::string env_choice(const char* name) {
  const Variable& var = lookup(name, Kind::Choice);
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return var.choices.front();
  if (std::find(var.choices.begin(), var.choices.end(), v) != var.choices.end()) return v;
  std::string list;
  for (size_t i = 0; i < var.choices.size(); ++i)
    list += (i == 0 ? "" : i + 1 == var.choices.size() ? " or " : ", ") + var.choices[i];
  MESHRT_FAIL(name << "='" << v << "' is not accepted: use " << list << ", or unset it ("
                   << var.choices.front() << ")");
}

int64_t env_int(const char* name, int64_t fallback) {
  const Variable& var = lookup(name, Kind::Int);
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  MESHRT_CHECK(end != v && *end == '\0' && errno == 0 && n >= var.lo && n <= var.hi,
               name << "='" << v << "' is not a whole number in [" << var.lo << ", " << var.hi
                    << "]: use one, or unset it");
  return n;
}

std::vector<std::pair<std::string, std::string>> env_rank_shared_settings() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Variable& var : table()) {
    if (!var.shared) continue;
    const char* raw = std::getenv(var.name);
    std::string v;
    try {
      if (var.kind == Kind::Switch)
        v = env_switch(var.name) ? "on" : "off";
      else if (var.kind == Kind::Choice)
        v = env_choice(var.name);
      else if (var.kind == Kind::Text)
        v = env_or(var.name, var.choices.front());  // its reader checks the value
      else
        v = std::to_string(env_int(var.name, 0));
    } catch (const Error&) {
      v = "'" + std::string(raw ? raw : "") + "' (not accepted)";
    }
    out.emplace_back(var.name, v);
  }
  return out;
}

void check_environment() {
  if (const char* v = std::getenv("MESHRT_LOG_LEVEL"); v != nullptr) {
    LogLevel l;
    if (!parse_log_level(v, &l)) {
      set_log_level(LogLevel::Warn);  // this refusal is the one message about it
      MESHRT_FAIL("MESHRT_LOG_LEVEL='" << v
                                       << "' is not a log level: use trace, debug, info, warn, "
                                          "error or off, or unset it (warn)");
    }
  }
  for (const Variable& var : table()) {
    switch (var.kind) {
      case Kind::Switch:
        env_switch(var.name);
        break;
      case Kind::Choice:
        env_choice(var.name);
        break;
      case Kind::Int:
        env_int(var.name, 0);
        break;
      case Kind::Text:
      case Kind::Tool:
        break;  // checked by their readers
    }
  }
  warn_unknown_environment();
}

namespace {

// Levenshtein distance between a and b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> env_known_names(bool scripts) {
  std::vector<std::string> out;
  for (const Variable& v : table())
    if (scripts || v.kind != Kind::Tool) out.emplace_back(v.name);
  return out;
}

std::vector<std::string> unknown_environment_warnings() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    if (entry.rfind("MESHRT_", 0) != 0) continue;
    names.push_back(entry.substr(0, entry.find('=')));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const Variable* best = nullptr;
    size_t best_d = 0;
    for (const Variable& v : table()) {
      const size_t d = edit_distance(name, v.name);
      if (best == nullptr || d < best_d) {
        best = &v;
        best_d = d;
      }
    }
    if (best_d == 0) continue;
    std::string msg = name + " is not a meshrt setting and is ignored";
    // A close name is a likely typo; past a third of the name it is a guess not worth showing.
    if (best_d <= std::max<size_t>(2, (name.size() - 7) / 3))
      msg += ": did you mean " + std::string(best->name) + "?";
    out.push_back(msg + " (docs/environment.md lists every setting)");
  }
  return out;
}

void warn_unknown_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& w : unknown_environment_warnings()) MESHRT_LOG_WARN(w);
  });
}

}  // namespace meshrt
