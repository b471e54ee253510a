// Environment settings with a fixed set of values, checked where they are read: an unknown value
// is refused with an Error naming the variable, the value and what is accepted, never silently
// taken as a default.
#pragma once

#include <cstdlib>
#include <string>

#include "meshrt/export.h"

namespace meshrt {

// A free-form variable (a path, an id, a number parsed by the caller): its value, or `fallback`
// when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// A switch: unset or "" is off; 1, true, on, yes are on; 0, false, off, no are off (any case).
// Anything else throws.
MESHRT_API bool env_switch(const char* name);

// Checks every such variable the runtime reads (MESHRT_LOG_LEVEL, MESHRT_STREAM_JITTER) at once,
// so a command refuses a typo before it starts instead of when (or if) the variable is first read.
MESHRT_API void check_environment();

}  // namespace meshrt
