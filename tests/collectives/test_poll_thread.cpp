// The NCCL communicator's polling helpers (collectives/poll_thread.h) on the CPU: the bounded wait
// of the debug call comparison and the watchdog thread's start, stop and join.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "collectives/poll_thread.h"
#include "runtime/error.h"

using namespace meshrt::detail;
using namespace std::chrono_literals;

TEST_CASE("poll_until returns done, aborted or timed out, and honours the deadline", "[unit]") {
  int calls = 0;
  CHECK(poll_until([&] { return ++calls == 3; }, [] { return false; }, Deadline::after(10)) ==
        PollResult::Done);
  CHECK(calls == 3);
  std::atomic<bool> abort{false};
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    abort = true;
  });
  CHECK(poll_until([] { return false; }, [&] { return abort.load(); }, Deadline::after(10)) ==
        PollResult::Aborted);
  t.join();
  // A query that never completes (a rank that never arrives) ends at the deadline.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(poll_until([] { return false; }, [] { return false; }, Deadline::after(0.1)) ==
        PollResult::TimedOut);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s >= 0.1);
  CHECK(s < 2.0);
  // A failing query propagates its error.
  CHECK_THROWS_AS(poll_until([]() -> bool { throw meshrt::Error("broken"); }, [] { return false; },
                             Deadline::after(1)),
                  meshrt::Error);
}

TEST_CASE("watchdog thread ticks until stopped, then joins and never ticks again", "[unit]") {
  std::atomic<int> ticks{0};
  auto w = std::make_unique<PollThread>(5ms, [&] { ++ticks; });
  CHECK_FALSE(w->running());
  CHECK(w->start());
  CHECK(w->start());  // idempotent
  CHECK(w->running());
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (ticks.load() < 3 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(ticks.load() >= 3);
  const auto t0 = std::chrono::steady_clock::now();
  w->stop();  // wakes it: no wait for the period, joins
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK_FALSE(w->running());
  const int after = ticks.load();
  std::this_thread::sleep_for(30ms);
  CHECK(ticks.load() == after);
  CHECK_FALSE(w->start());  // a stopped watchdog stays stopped (process exit)
  w.reset();                // destructor after stop: nothing left to join
}

TEST_CASE("watchdog destructor stops and joins a running thread", "[unit]") {
  std::atomic<int> ticks{0};
  std::atomic<bool> in_tick{false};
  {
    PollThread w(1ms, [&] {
      in_tick = true;
      std::this_thread::sleep_for(10ms);  // a tick in progress finishes before the join returns
      ++ticks;
      in_tick = false;
    });
    w.start();
    while (ticks.load() == 0) std::this_thread::sleep_for(1ms);
  }
  CHECK_FALSE(in_tick.load());
  const int after = ticks.load();
  std::this_thread::sleep_for(20ms);
  CHECK(ticks.load() == after);
}
