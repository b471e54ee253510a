#include "runtime/thread.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

// detail::fail_thread_start's setting: `left` starts whose `what` contains `part` still succeed;
// the start at left == 0 fails. -1: off.
std::mutex g_fault_mu;
std::string g_fault_part;
int g_fault_left = -1;

// Whether this start is the one detail::fail_thread_start asked to fail.
bool injected_failure(const std::string& what) {
  std::lock_guard<std::mutex> lk(g_fault_mu);
  if (g_fault_left < 0 || what.find(g_fault_part) == std::string::npos) return false;
  return g_fault_left-- == 0;
}

}  // namespace

namespace detail {

void fail_thread_start(const std::string& what_part, int after) {
  std::lock_guard<std::mutex> lk(g_fault_mu);
  g_fault_part = what_part;
  g_fault_left = after;
}

}  // namespace detail

std::thread start_thread(std::function<void()> fn, const std::string& what,
                         const std::string& hint) {
  try {
    if (injected_failure(what))
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    // Nothing leaves a thread's entry: an exception there would end the process through
    // std::terminate. Each thread catches what its work can throw and reports it to the call
    // that waits (a stream's error, a rank's status); this is the last guard, for a bug.
    return std::thread([fn = std::move(fn), what] {
      try {
        fn();
      } catch (const std::exception& e) {
        MESHRT_LOG_ERROR(
            "internal error (please report): " << what << " ended with an exception: " << e.what());
      } catch (...) {
        MESHRT_LOG_ERROR("internal error (please report): "
                         << what << " ended with an exception of unknown type");
      }
    });
  } catch (const std::system_error& e) {
    MESHRT_FAIL_SYSTEM("could not start " << what << ": " << e.code().message() << "; " << hint);
  }
}

namespace {

// Holds the threads of start_threads until all exist (go) or one could not start (cancel).
struct StartGate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, cancelled = false;

  // Whether the thread may run its work: false once cancelled.
  bool wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return open; });
    return !cancelled;
  }
  void release(bool cancel) {
    {
      std::lock_guard<std::mutex> lk(mu);
      open = true;
      cancelled = cancel;
    }
    cv.notify_all();
  }
};

}  // namespace

std::vector<std::thread> start_threads(int n, std::function<void(int)> fn, const std::string& what,
                                       const std::string& hint) {
  auto gate = std::make_shared<StartGate>();
  auto work = std::make_shared<std::function<void(int)>>(std::move(fn));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n > 0 ? n : 0));
  for (int i = 0; i < n; ++i) {
    try {
      threads.push_back(start_thread(
          [gate, work, i] {
            if (gate->wait()) (*work)(i);
          },
          "thread " + std::to_string(i + 1) + " of " + std::to_string(n) + " for " + what, hint));
    } catch (...) {
      gate->release(true);
      for (std::thread& t : threads) t.join();
      throw;
    }
  }
  gate->release(false);
  return threads;
}

}  // namespace meshrt
