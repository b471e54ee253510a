#include "runtime/logging.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <utility>

#include "runtime/env.h"
#include "runtime/stop.h"

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

// Writes [p, p + n) to fd, waiting at most wait_ms in all for the reader (wait_ms < 0: as long
// as it takes). False when the time ran out (a part may have been written) or fd is gone.
bool write_within(int fd, const char* p, size_t n, int wait_ms) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(wait_ms < 0 ? 0 : wait_ms);
  while (n > 0) {
    if (wait_ms >= 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      pollfd pfd{fd, POLLOUT, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(left < 0 ? 0 : left));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return false;  // the reader took nothing in time
      if (r < 0 || (pfd.revents & (POLLERR | POLLNVAL))) return false;
    }
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;  // the output is gone: nothing to report it to
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// stdout's and stderr's drop state (logging.h's print_line: output that does not hold the run).
struct OutputState {
  std::mutex mu;
  unsigned long long dropped = 0;  // lines lost since the reader last took one
  int write_errno = 0;             // the first write error but a closed pipe (ENOSPC, EIO, ...)
};
OutputState& output_state(int fd) {
  static OutputState st[2];
  return st[fd == STDERR_FILENO ? 1 : 0];
}

// One whole line to stdout or stderr, by the policy print_line describes.
void write_output_line(int fd, const std::string& line) {
  OutputState& st = output_state(fd);
  std::lock_guard<std::mutex> lk(st.mu);
  const bool bounded = graceful_stop();
  const int wait_ms = bounded ? kOutputStallMs : -1;
  if (st.dropped > 0) {  // lines were lost: say so first, once the reader takes output again
    const std::string note = "meshrt: " + std::to_string(st.dropped) +
                             " output line(s) dropped: nothing read this output for " +
                             std::to_string(kOutputStallMs) + " ms while the run went on\n";
    // While the run goes on, a reader still away costs this line no wait at all.
    if (!write_within(fd, note.data(), note.size(), bounded ? 0 : -1)) {
      ++st.dropped;
      return;
    }
    st.dropped = 0;
  }
  errno = 0;
  if (!write_within(fd, line.data(), line.size(), wait_ms)) {
    // A closed pipe is the reader's choice (SIGPIPE, or the commands' own stop); a full disk or
    // an I/O error loses the output: the command's exit status says so (output_write_error).
    if (errno != 0 && errno != EPIPE && errno != EAGAIN && st.write_errno == 0)
      st.write_errno = errno;
    if (bounded) ++st.dropped;
  }
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
    write_output_line(STDERR_FILENO, line);
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

int output_write_error(std::ostream& os) {
  const int fd = &os == &std::cout ? STDOUT_FILENO : &os == &std::cerr ? STDERR_FILENO : -1;
  if (fd < 0) return 0;
  OutputState& st = output_state(fd);
  std::lock_guard<std::mutex> lk(st.mu);
  return st.write_errno;
}

void print_line(std::ostream& os, const std::string& line) {
  os.flush();
  const int fd = &os == &std::cout ? STDOUT_FILENO : &os == &std::cerr ? STDERR_FILENO : -1;
  if (fd < 0) {
    os.write(line.data(), static_cast<std::streamsize>(line.size()));
    os.flush();
    return;
  }
  std::fflush(fd == STDOUT_FILENO ? stdout : stderr);  // C stdio's pending text goes first
  write_output_line(fd, line);
}

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
