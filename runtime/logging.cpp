#include "runtime/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include "runtime/env.h"

namespace meshrt {

bool parse_log_level(const char* v, LogLevel* out) {
  if (!v || !*v) {
    *out = LogLevel::Warn;
    return true;
  }
  static const std::pair<const char*, LogLevel> kLevels[] = {
      {"trace", LogLevel::Trace}, {"debug", LogLevel::Debug},  {"info", LogLevel::Info},
      {"warn", LogLevel::Warn},   {"warning", LogLevel::Warn}, {"error", LogLevel::Error},
      {"off", LogLevel::Off}};
  for (const auto& [name, level] : kLevels)
    if (!std::strcmp(v, name)) {
      *out = level;
      return true;
    }
  return false;
}

namespace {

// MESHRT_LOG_LEVEL, read once and lazily (possibly inside a destructor: no exception here).
// Commands refuse a bad value up front (check_environment, runtime/env.h), which settles the
// level first; a program that never checks gets one warning at the first log decision.
struct LevelState {
  std::atomic<int> level{static_cast<int>(LogLevel::Warn)};
  std::atomic<bool> warn_bad{false};
  std::string bad;
  LevelState() {
    const std::string v = env_or("MESHRT_LOG_LEVEL");
    LogLevel l = LogLevel::Warn;
    if (parse_log_level(v.c_str(), &l)) {
      level = static_cast<int>(l);
    } else {
      bad = v;
      warn_bad = true;
    }
  }
};

LevelState& level_state() {
  static LevelState s;
  return s;
}

thread_local int tls_rank = 0;
thread_local int tls_world = 1;

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> lg = [] {
    auto l = spdlog::stderr_color_mt("meshrt");
    l->set_pattern("%H:%M:%S.%e %^%l%$ %v");
    l->set_level(spdlog::level::trace);
    return l;
  }();
  return lg;
}

std::mutex& sink_mu() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<const LogSink>& sink_store() {
  static std::shared_ptr<const LogSink> sink;
  return sink;
}

}  // namespace

void set_log_sink(LogSink sink) {
  std::shared_ptr<const LogSink> s;
  if (sink) s = std::make_shared<const LogSink>(std::move(sink));
  std::lock_guard<std::mutex> lk(sink_mu());
  sink_store() = std::move(s);
}

LogLevel log_level() {
  LevelState& s = level_state();
  if (s.warn_bad.load(std::memory_order_relaxed) && s.warn_bad.exchange(false))
    std::fprintf(stderr,
                 "meshrt: MESHRT_LOG_LEVEL='%s' is not a log level (trace, debug, info, warn, "
                 "error or off): logging at warn\n",
                 s.bad.c_str());
  return static_cast<LogLevel>(s.level.load(std::memory_order_relaxed));
}
void set_log_level(LogLevel level) {
  LevelState& s = level_state();
  s.warn_bad = false;  // decided: no warning about the variable
  s.level.store(static_cast<int>(level));
}
bool log_enabled(LogLevel level) {
  return level != LogLevel::Off && static_cast<int>(level) >= static_cast<int>(log_level());
}
void set_log_rank(int rank, int world) {
  tls_rank = rank;
  tls_world = world;
}
int log_rank() { return tls_rank; }
int log_world() { return tls_world; }

void log_message(LogLevel level, const std::string& msg) {
  std::shared_ptr<const LogSink> sink;
  {
    std::lock_guard<std::mutex> lk(sink_mu());
    sink = sink_store();
  }
  if (sink) {
    (*sink)(level, tls_rank, tls_world, msg);
    return;
  }
  static const spdlog::level::level_enum map[] = {spdlog::level::trace, spdlog::level::debug,
                                                  spdlog::level::info,  spdlog::level::warn,
                                                  spdlog::level::err,   spdlog::level::off};
  logger()->log(map[static_cast<int>(level)], "[rank {}/{}] {}", tls_rank, tls_world, msg);
}

}  // namespace meshrt
