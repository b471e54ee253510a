// The benchmarks' shared statistics and timing helpers (bench/common/stats.h).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "bench/common/stats.h"

using namespace meshrt;

TEST_CASE("median and percentile interpolate between the sorted values", "[unit]") {
  CHECK(bench::median({}) == 0.0);
  CHECK(bench::median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(bench::median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK(bench::percentile({10.0, 20.0, 30.0, 40.0, 50.0}, 0.0) == 10.0);
  CHECK(bench::percentile({10.0, 20.0, 30.0, 40.0, 50.0}, 0.9) == Approx(46.0));
  CHECK(bench::percentile({10.0, 20.0, 30.0, 40.0, 50.0}, 1.0) == 50.0);
}

TEST_CASE("wait_for_idle_threads returns once a spinning thread sleeps", "[unit]") {
  // A thread that spins (running, as OpenBLAS's workers do after a call) for 150 ms of its own
  // time, then blocks. The wait must not return while it spins: when it returns, the thread has
  // finished spinning, whatever the load (a preempted spinner is still runnable).
  std::atomic<bool> spun{false}, started{false};
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::thread spinner([&] {
    started = true;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(150)) {
    }
    spun = true;
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return release; });
  });
  while (!started) std::this_thread::yield();
  REQUIRE(bench::wait_for_idle_threads(60000));
  CHECK(spun);
  // With a limit shorter than the spin, it gives up and says so.
  {
    std::lock_guard<std::mutex> lk(mu);
    release = true;
  }
  cv.notify_all();
  spinner.join();
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) {
    }
  });
  CHECK_FALSE(bench::wait_for_idle_threads(20));
  stop = true;
  busy.join();
}
