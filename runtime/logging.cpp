#include "runtime/logging.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
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

// stderr, each line in one write() (spdlog's colour sink writes a line in up to five pieces, which
// a launcher merging several processes' output, such as mpirun, interleaves with other lines).
// The level is coloured when stderr is a terminal.
class WholeLineSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  WholeLineSink() : color_(isatty(STDERR_FILENO) == 1) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t f;
    formatter_->format(msg, f);
    std::string line;
    line.reserve(f.size() + 16);
    const size_t a = msg.color_range_start, b = msg.color_range_end;
    if (color_ && b > a && b <= f.size()) {
      line.append(f.data(), a);
      line += msg.level >= spdlog::level::err    ? "\033[31m"
              : msg.level == spdlog::level::warn ? "\033[33m"
                                                 : "\033[32m";
      line.append(f.data() + a, b - a);
      line += "\033[m";
      line.append(f.data() + b, f.size() - b);
    } else {
      line.append(f.data(), f.size());
    }
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // stderr is gone: nothing to report it to
      done += static_cast<size_t>(n);
    }
  }
  void flush_() override {}

 private:
  bool color_;
};

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> lg = [] {
    auto l = std::make_shared<spdlog::logger>("meshrt", std::make_shared<WholeLineSink>());
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
