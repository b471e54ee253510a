// Polling helpers of the device communicators: a bounded wait on a completion query, and the
// watchdog thread that ticks until it is stopped and joined (never detached, so it cannot touch
// CUDA or NCCL state while the process exits).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "collectives/comm_detail.h"
#include "runtime/thread.h"

namespace meshrt::detail {

enum class PollResult { Done, Aborted, TimedOut };

// Calls done() until it returns true, aborted() returns true, or `dl` passes (in that order of
// precedence at each round); yields between rounds. done() may throw: the error propagates.
template <class Done, class Aborted>
PollResult poll_until(Done&& done, Aborted&& aborted, const Deadline& dl) {
  for (;;) {
    if (done()) return PollResult::Done;
    if (aborted()) return PollResult::Aborted;
    if (dl.passed()) return PollResult::TimedOut;
    std::this_thread::yield();
  }
}

// Runs tick() on its own thread every `period` from the first start() until stop(), which wakes
// it and joins it; the destructor stops it. A tick in progress finishes before stop() returns,
// and no tick starts after.
class PollThread {
 public:
  PollThread(std::chrono::milliseconds period, std::function<void()> tick)
      : period_(period), tick_(std::move(tick)) {}
  ~PollThread() { stop(); }
  PollThread(const PollThread&) = delete;
  PollThread& operator=(const PollThread&) = delete;

  // Starts the thread if it is not running and was never stopped; false once stopped.
  bool start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return false;
    if (!thread_.joinable())
      thread_ = start_thread([this] { loop(); }, "a communicator's poll thread",
                             "raise ulimit -u / ulimit -v");
    return true;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }
  bool running() const {
    std::lock_guard<std::mutex> lk(mu_);
    return thread_.joinable() && !stopped_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, period_, [this] { return stopped_; })) {
      lk.unlock();
      tick_();
      lk.lock();
    }
  }

  const std::chrono::milliseconds period_;
  std::function<void()> tick_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace meshrt::detail
