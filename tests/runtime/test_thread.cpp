// start_thread / start_threads (runtime/thread.h): a thread the system cannot create is a
// SystemError naming the thread, the reason and what to change, never std::terminate; the threads
// of a group already started return without running their work and are joined.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/stream.h"
#include "runtime/thread.h"

using namespace meshrt;

namespace {

// Turns detail::fail_thread_start off when a case ends, passed or not.
struct NoInjectedFailure {
  ~NoInjectedFailure() { detail::fail_thread_start("", -1); }
};

// This process's address space in bytes (VmSize of /proc/self/status), 0 when unknown.
size_t address_space_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kThreadTestSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kThreadTestSanitized = true;
#else
constexpr bool kThreadTestSanitized = false;
#endif
#else
constexpr bool kThreadTestSanitized = false;
#endif

}  // namespace

TEST_CASE("thread: a refused start is an error naming the thread and what to change", "[unit]") {
  NoInjectedFailure off;
  detail::fail_thread_start("the test", 0);
  try {
    start_thread([] {}, "the test's thread", "raise ulimit -u / ulimit -v");
    FAIL("no error");
  } catch (const SystemError& e) {
    CHECK(e.message() ==
          "could not start the test's thread: Resource temporarily unavailable; raise ulimit "
          "-u / ulimit -v");
  }
  // One failure only: the next start succeeds.
  std::thread t = start_thread([] {}, "the test's thread", "raise ulimit -u / ulimit -v");
  t.join();
}

TEST_CASE("thread: an exception leaving a thread's function is logged, not std::terminate",
          "[unit]") {
  std::mutex mu;
  std::vector<std::string> errors;
  set_log_sink([&](LogLevel level, int, int, const std::string& msg) {
    std::lock_guard<std::mutex> lk(mu);
    if (level == LogLevel::Error) errors.push_back(msg);
  });
  std::thread a = start_thread([] { throw std::runtime_error("boom"); }, "the test's thread", "");
  std::thread b = start_thread([] { throw 42; }, "the other thread", "");
  a.join();
  b.join();
  set_log_sink(nullptr);
  std::sort(errors.begin(), errors.end());
  REQUIRE(errors == std::vector<std::string>{
                        "internal error (please report): the other thread ended with an "
                        "exception of unknown type",
                        "internal error (please report): the test's thread ended with an "
                        "exception: boom"});
}

TEST_CASE("thread: a group whose thread 3 cannot start runs none of its work", "[unit]") {
  NoInjectedFailure off;
  std::atomic<int> ran{0};
  detail::fail_thread_start("the test", 2);
  try {
    std::vector<std::thread> ts = start_threads(
        8, [&](int) { ran.fetch_add(1); }, "the test",
        "lower --devices or raise ulimit -u / ulimit -v");
    for (std::thread& t : ts) t.join();
    FAIL("no error");
  } catch (const SystemError& e) {
    CHECK(e.message() ==
          "could not start thread 3 of 8 for the test: Resource temporarily unavailable; lower "
          "--devices or raise ulimit -u / ulimit -v");
  }
  CHECK(ran.load() == 0);
  // Without a failure every thread runs its index once.
  std::vector<std::atomic<int>> seen(8);
  std::vector<std::thread> ts = start_threads(
      8, [&](int i) { seen[static_cast<size_t>(i)].fetch_add(1); }, "the test", "");
  for (std::thread& t : ts) t.join();
  for (auto& s : seen) CHECK(s.load() == 1);
}

TEST_CASE("thread: a host stream whose worker cannot start is refused", "[unit]") {
  NoInjectedFailure off;
  detail::fail_thread_start("worker thread of stream", 0);
  try {
    (void)make_host_stream("s0", 0);
    FAIL("no error");
  } catch (const SystemError& e) {
    CHECK(e.message() ==
          "could not start the worker thread of stream 's0': Resource temporarily unavailable; "
          "run fewer ranks or raise ulimit -u / ulimit -v");
  }
}

// The system's own refusal: a child whose address space leaves room for a few thread stacks only
// starts 64 threads. Without the error, std::thread's exception would end it in std::terminate.
TEST_CASE("thread: starts past the address-space limit fail cleanly", "[unit]") {
  if (kThreadTestSanitized) {
    WARN("not run: sanitizer runtimes reserve address space of their own");
    return;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    int rc = 0;
    const rlim_t cap = address_space_bytes() + (48u << 20);  // a few 8 MiB stacks
    rlimit lim{cap, cap};
    if (address_space_bytes() == 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
    std::atomic<int> ran{0};
    try {
      std::vector<std::thread> ts = start_threads(
          64, [&](int) { ran.fetch_add(1); }, "the test", "raise ulimit -v");
      for (std::thread& t : ts) t.join();
      out = "all started";
      rc = 4;
    } catch (const SystemError& e) {
      out = e.message();
      rc = ran.load() == 0 ? 0 : 5;
    }
    if (::write(fds[1], out.data(), out.size()) < 0) rc = 6;
    _exit(rc);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t n = 0;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child's message: " << msg);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(msg.rfind("could not start thread ", 0) == 0);
  CHECK(msg.find(" of 64 for the test: Resource temporarily unavailable; raise ulimit -v") !=
        std::string::npos);
}
