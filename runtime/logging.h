// Logging: spdlog behind a plain interface; each line carries the rank ("[rank 3/8]").
#pragma once

#include <functional>
#include <ostream>
#include <sstream>
#include <string>

#include "runtime/plugin_api.h"
namespace meshrt {

enum class LogLevel : int { Trace = 0, Debug, Info, Warn, Error, Off };

// Level from MESHRT_LOG_LEVEL (trace|debug|info|warn|error|off; default warn), read once.
LogLevel log_level();
// Parses a MESHRT_LOG_LEVEL value ("" is the default, warn); false when it is not a level.
bool parse_log_level(const char* v, LogLevel* out);
void set_log_level(LogLevel level);
MESHRT_PLUGIN_API bool log_enabled(LogLevel level);
// The calling thread's rank for log lines; stream workers inherit their creator's.
void set_log_rank(int rank, int world);
int log_rank();
int log_world();
MESHRT_PLUGIN_API void log_message(LogLevel level, const std::string& msg);

// Where log lines go instead of stderr (an embedding engine's logger, e.g. through the C API's
// meshrt_set_log_callback): called with the line's level, the logging thread's rank and world
// size, and the message without timestamp or rank prefix. An empty function restores stderr.
// Safe to call from any thread; the sink itself may be called from any thread at once.
using LogSink = std::function<void(LogLevel level, int rank, int world, const std::string& msg)>;
void set_log_sink(LogSink sink);

// Writes one whole output line (`line` ends with '\n') to `os` in one write and flushes, so that a
// launcher merging several processes' output (mpirun) never splits it with another line: what
// was pending is flushed first. Every line a command prints for the user goes through this (log
// lines are written whole by the logger itself, through the same policy).
//
// While a command that stops at safe points runs (runtime/stop.h's graceful_stop(): meshrt train,
// tune), its stdout / stderr never hold the run: a line the reader does not take within
// kOutputStallMs is dropped and counted, later lines are dropped at once until the reader takes
// output again, and then a note says how many were lost. (mpirun stops reading its ranks' output
// as soon as it is signalled, until they exit: rank 0 blocked on a full pipe would hold every
// rank in its next collective, past the stop.) Other commands block on a slow reader as usual.
constexpr int kOutputStallMs = 500;
void print_line(std::ostream& os, const std::string& line);
// The errno of the first print_line write to `os` (std::cout or std::cerr) that failed for
// another reason than a reader that closed it: ENOSPC (a full disk, /dev/full), EIO, EFBIG...;
// 0 when none did. main() turns it into exit status 1, as for a stream that failed to flush.
int output_write_error(std::ostream& os);

}  // namespace meshrt

#define MESHRT_LOG(level, msg)                            \
  do {                                                    \
    if (::meshrt::log_enabled(level)) {                   \
      std::ostringstream meshrt_log_os_;                  \
      meshrt_log_os_ << msg;                              \
      ::meshrt::log_message(level, meshrt_log_os_.str()); \
    }                                                     \
  } while (0)
#define MESHRT_LOG_DEBUG(msg) MESHRT_LOG(::meshrt::LogLevel::Debug, msg)
#define MESHRT_LOG_INFO(msg) MESHRT_LOG(::meshrt::LogLevel::Info, msg)
#define MESHRT_LOG_WARN(msg) MESHRT_LOG(::meshrt::LogLevel::Warn, msg)
#define MESHRT_LOG_ERROR(msg) MESHRT_LOG(::meshrt::LogLevel::Error, msg)
