// Environment settings, checked where they are read: an unknown value is refused with an Error
// naming the variable, the value and what is accepted, never silently taken as a default. Every
// variable with a fixed set of values (a switch, a choice, a bounded whole number) is described
// once, in env.cpp's table; the readers below look its description up by name, and
// check_environment checks them all before a command starts. The table also lists the free-form
// variables and those of meshrt's scripts: it is the one list of MESHRT_ names meshrt knows.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "meshrt/export.h"

namespace meshrt {

// A free-form variable (a path, an id, a spec with its own parser): its value, or `fallback`
// when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// A switch of the table: unset or "" is its default (off unless the table says on); 1, true, on,
// yes are on; 0, false, off, no are off (any case). Anything else throws.
MESHRT_API bool env_switch(const char* name);

// A choice of the table: its value, or the table's default when unset or "". A value that is
// not one of the table's throws.
MESHRT_API std::string env_choice(const char* name);

// A whole number of the table, within its bounds: its value, or `fallback` when unset or "".
// Anything else throws.
MESHRT_API int64_t env_int(const char* name, int64_t fallback);

// The variables of the table that every rank of a launch must set alike, because they change
// which collectives run (MESHRT_COMM_DEBUG's data checks) or the numbers the ranks compute (the
// GEMM and attention choices, MESHRT_HOST_ISA, MESHRT_CUBLAS_TF32, MESHRT_NCCL_HALF_REDUCE):
// (name, value as read: "on" / "off" for a switch, the choice (the default when unset), so that
// equal settings written differently agree; a value the table does not accept as given, quoted;
// a free-form value as given, its default when unset). Never throws.
// collectives/config_check.h compares them across the ranks of a process launch.
MESHRT_API std::vector<std::pair<std::string, std::string>> env_rank_shared_settings();

// Checks every variable of the table at once (and MESHRT_LOG_LEVEL), so a command refuses a
// typo before it starts instead of when (or if) the variable is first read; then
// warn_unknown_environment().
MESHRT_API void check_environment();

// Every MESHRT_ name the table knows: the library's settings (docs/environment.md), free-form ones
// included, and with `scripts` the variables of meshrt's own scripts and tests.
MESHRT_API std::vector<std::string> env_known_names(bool scripts = true);

// One line per MESHRT_-prefixed variable of the environment that the table does not know (a
// misspelt name would otherwise be ignored silently), sorted by name, each suggesting the closest
// known name when one is close: "MESHRT_LAUNCH_BLOCKNG is not a meshrt setting and is ignored:
// did you mean MESHRT_LAUNCH_BLOCKING? (docs/environment.md lists every setting)".
MESHRT_API std::vector<std::string> unknown_environment_warnings();

// Logs unknown_environment_warnings() as warnings, once per process (later calls do nothing).
MESHRT_API void warn_unknown_environment();

}  // namespace meshrt
