#include "runtime/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  MESHRT_FAIL(name << "='" << v << "' is not a switch: use 1 (or true, on, yes) or 0 (or false, "
                   << "off, no), or unset it");
}

void check_environment() {
  if (const char* v = std::getenv("MESHRT_LOG_LEVEL"); v != nullptr) {
    LogLevel l;
    MESHRT_CHECK(parse_log_level(v, &l), "MESHRT_LOG_LEVEL='"
                                             << v
                                             << "' is not a log level: use trace, debug, info, "
                                                "warn, error or off, or unset it");
  }
  env_switch("MESHRT_STREAM_JITTER");
  env_switch("MESHRT_LAUNCH_BLOCKING");
}

}  // namespace meshrt
