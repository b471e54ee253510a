#include "runtime/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

enum class Kind { Switch, Choice, Int };

// One environment variable with a fixed set of values.
struct Variable {
  const char* name;
  Kind kind;
  std::vector<std::string> choices;  // Choice: the accepted values, the first is the default
  int64_t lo = 0, hi = 0;            // Int: the bounds
  bool on = false;                   // Switch: its default
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

// Every such variable meshrt reads (docs/environment.md).
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
      shared(one_of("MESHRT_HOST_F32_GEMM", {"auto", "openblas", "onednn"})),
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
    }
  }
}

}  // namespace meshrt
