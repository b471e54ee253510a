#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "runtime/thread_inline.h"
#include "tests/common/env.h"

using namespace meshrt;
using namespace std::chrono_literals;

TEST_CASE("a host stream runs thousands of tasks in order", "[stream]") {
  auto s = make_host_stream_jitter("s", false);
  std::vector<int> seen;
  seen.reserve(5000);
  for (int i = 0; i < 5000; ++i) s->enqueue([&seen, i] { seen.push_back(i); });
  s->synchronize();
  REQUIRE(seen.size() == 5000);
  for (int i = 0; i < 5000; ++i) REQUIRE(seen[static_cast<size_t>(i)] == i);
}

TEST_CASE("cross-stream waits order producers before consumers under jitter", "[stream]") {
  auto prod = make_host_stream_jitter("prod", true);
  auto cons = make_host_stream_jitter("cons", true);
  constexpr int kRounds = 300;
  std::vector<int> slot(kRounds, 0), read(kRounds, -1);
  for (int i = 0; i < kRounds; ++i) {
    prod->enqueue([&slot, i] { slot[static_cast<size_t>(i)] = i + 1; });
    Event e = prod->record();
    cons->wait(e);
    cons->enqueue(
        [&slot, &read, i] { read[static_cast<size_t>(i)] = slot[static_cast<size_t>(i)]; });
  }
  cons->synchronize();
  for (int i = 0; i < kRounds; ++i) REQUIRE(read[static_cast<size_t>(i)] == i + 1);
}

TEST_CASE("a deliberately missing wait shows up as a wrong result under jitter", "[stream]") {
  // The same program as above without cons->wait(e): with jitter the consumer overtakes the
  // producer in some rounds. This is the property the jitter switch exists for.
  auto prod = make_host_stream_jitter("prod", true);
  auto cons = make_host_stream_jitter("cons", true);
  constexpr int kRounds = 300;
  std::vector<std::atomic<int>> slot(kRounds);
  std::vector<int> read(kRounds, -1);
  for (int i = 0; i < kRounds; ++i) {
    prod->enqueue([&slot, i] {
      std::this_thread::sleep_for(20us);
      slot[static_cast<size_t>(i)] = i + 1;
    });
    cons->enqueue(
        [&slot, &read, i] { read[static_cast<size_t>(i)] = slot[static_cast<size_t>(i)]; });
  }
  cons->synchronize();
  prod->synchronize();
  int wrong = 0;
  for (int i = 0; i < kRounds; ++i) wrong += read[static_cast<size_t>(i)] != i + 1;
  INFO("rounds with a stale read: " << wrong);
  REQUIRE(wrong > 0);
}

TEST_CASE("events signal, report elapsed time and query state", "[stream][event]") {
  auto s = make_host_stream_jitter("s", false);
  std::atomic<bool> gate{false};
  Event start = s->record();
  s->enqueue([&] {
    while (!gate) std::this_thread::sleep_for(100us);
    std::this_thread::sleep_for(5ms);
  });
  Event end = s->record();
  REQUIRE(!end.query());
  gate = true;
  end.synchronize();
  REQUIRE(end.query());
  REQUIRE(end.elapsed_ms(start) >= 4.5f);
  REQUIRE(Event().query());  // default events are complete
}

TEST_CASE("hold_until_done keeps an owner alive until the work before it ran", "[stream]") {
  auto s = make_host_stream_jitter("s", false);
  std::atomic<bool> gate{false};
  s->enqueue([&] {
    while (!gate) std::this_thread::sleep_for(100us);
  });
  auto owner = std::make_shared<int>(7);
  std::weak_ptr<int> w = owner;
  s->hold_until_done(std::move(owner));
  std::this_thread::sleep_for(20ms);
  REQUIRE(!w.expired());  // the task before it has not run
  gate = true;
  s->synchronize();
  REQUIRE(w.expired());
  s->hold_until_done(nullptr);  // nothing to hold: a no-op
  s->synchronize();
}

TEST_CASE("an error in a task reaches synchronize and waiting streams", "[stream][event]") {
  auto a = make_host_stream_jitter("a", false), b = make_host_stream_jitter("b", false);
  a->enqueue([] { MESHRT_FAIL("boom in task 3 of stream a"); });
  Event e = a->record();
  b->wait(e);
  std::atomic<int> ran{0};
  b->enqueue([&] { ran++; });
  REQUIRE_THROWS_WITH(e.synchronize(), Catch::Contains("boom in task 3"));
  REQUIRE_THROWS_WITH(b->synchronize(), Catch::Contains("boom in task 3"));
  REQUIRE(ran == 1);  // later tasks still run (they may be signals others wait on)
  REQUIRE_THROWS_WITH(a->synchronize(), Catch::Contains("boom"));
  a->synchronize();  // reported once; the stream is usable again
}

TEST_CASE("a bad MESHRT_HOST_POLL_US fails the stream's creation, not its worker thread",
          "[stream]") {
  // The worker read it (and threw past its entry: std::terminate, exit 134) when it was first read
  // there; it is read on the creating thread now, whose caller gets the error.
  for (const char* bad : {"-1", "2000000"}) {
    meshrt::test::ScopedEnv env("MESHRT_HOST_POLL_US", bad);
    REQUIRE_THROWS_WITH(make_host_stream("s", 0),
                        Catch::Contains(std::string("MESHRT_HOST_POLL_US='") + bad +
                                        "' is not a whole number in [0, 1000000]"));
  }
  auto s = make_host_stream("s", 0);
  std::atomic<int> ran{0};
  s->enqueue([&] { ran++; });
  s->synchronize();
  REQUIRE(ran == 1);
}

TEST_CASE("synchronize may run queued tasks on the waiting thread: order and exclusion hold",
          "[stream]") {
  // synchronize() takes queued tasks off an idle worker and runs them itself (who runs one is a
  // race by design). Whoever runs them: in order, never two at once, only on the worker or the
  // synchronizing thread, and a task's error is reported once.
  for (const bool jitter : {false, true}) {
    INFO("jitter " << jitter);
    auto s = make_host_stream_jitter("s", jitter);
    const int rounds = jitter ? 200 : 3000;
    std::atomic<int> active{0};
    int overlaps = 0, next = 0, out_of_order = 0;
    std::vector<std::thread::id> ran_on;
    ran_on.reserve(static_cast<size_t>(rounds) * 3);
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < 3; ++k) {
        const int seq = r * 3 + k;
        s->enqueue([&, seq] {
          if (active.fetch_add(1) != 0) ++overlaps;
          if (next != seq) ++out_of_order;
          next = seq + 1;
          ran_on.push_back(std::this_thread::get_id());
          active.fetch_sub(1);
        });
      }
      s->synchronize();
    }
    CHECK(overlaps == 0);
    CHECK(out_of_order == 0);
    CHECK(next == rounds * 3);
    std::set<std::thread::id> others;
    for (const std::thread::id& id : ran_on)
      if (id != std::this_thread::get_id()) others.insert(id);
    CHECK(others.size() <= 1);  // the one worker
    // An error in a task that either thread runs is reported by the next synchronize, once.
    s->enqueue([] { MESHRT_FAIL("boom in a helped task"); });
    REQUIRE_THROWS_WITH(s->synchronize(), Catch::Contains("boom in a helped task"));
    s->synchronize();
  }
}

TEST_CASE("inline mode runs a task on the caller when the stream is idle, else queues it",
          "[stream]") {
  auto s = make_host_stream_jitter("s", false);
  const std::thread::id me = std::this_thread::get_id();
  REQUIRE_FALSE(set_thread_inline(true));
  // Idle: the task ran here, before enqueue returned, and so did the event's signal.
  std::thread::id ran_on;
  s->enqueue([&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == me);
  CHECK(s->record().query());
  // Busy (a task holds the worker): the next ones queue behind it, in order, on the worker.
  std::atomic<bool> release{false}, started{false};
  std::vector<int> order;
  REQUIRE(set_thread_inline(false));
  s->enqueue([&] {
    started = true;
    while (!release) std::this_thread::yield();
    order.push_back(1);
  });
  while (!started) std::this_thread::yield();
  set_thread_inline(true);
  s->enqueue([&] { order.push_back(2); });
  CHECK(order.empty());  // queued, not run here (synchronize below may run it here)
  release = true;
  s->synchronize();
  CHECK(order == std::vector<int>{1, 2});
  // An inline task's error reaches synchronize, as a queued one's does.
  s->enqueue([] { MESHRT_FAIL("boom inline"); });
  REQUIRE_THROWS_WITH(s->synchronize(), Catch::Contains("boom inline"));
  CHECK(set_thread_inline(false));
}

TEST_CASE("synchronize runs a queued cross-stream wait without deadlock", "[stream]") {
  // A task that waits for another stream's event may run on the synchronizing thread.
  auto a = make_host_stream_jitter("a", false), b = make_host_stream_jitter("b", false);
  for (int i = 0; i < 500; ++i) {
    int x = 0, y = -1;
    a->enqueue([&x] { x = 1; });
    b->wait(a->record());
    b->enqueue([&x, &y] { y = x; });
    b->synchronize();
    REQUIRE(y == 1);
    a->synchronize();
  }
}

TEST_CASE("stress: several streams, thousands of tasks and cross waits", "[stream]") {
  constexpr int kStreams = 4, kSteps = 1000;
  std::vector<std::unique_ptr<Stream>> ss;
  for (int i = 0; i < kStreams; ++i) ss.push_back(make_host_stream_jitter("s", i % 2 == 0));
  // A token passed round-robin: stream k increments it at step t only after stream k-1 did.
  int64_t token = 0;
  Event prev;
  for (int t = 0; t < kSteps; ++t) {
    Stream& s = *ss[static_cast<size_t>(t % kStreams)];
    s.wait(prev);
    s.enqueue([&token, t] {
      if (token != t) throw Error("out of order");
      token = t + 1;
    });
    prev = s.record();
  }
  for (auto& s : ss) s->synchronize();
  REQUIRE(token == kSteps);
}

TEST_CASE("context side streams are created once and synchronised", "[stream][context]") {
  Context ctx(Device::cpu());
  Stream& a = ctx.stream("comm.tp");
  Stream& b = ctx.stream("comm.tp");
  REQUIRE(&a == &b);
  std::atomic<int> n{0};
  a.enqueue([&] {
    std::this_thread::sleep_for(2ms);
    n++;
  });
  ctx.synchronize();
  REQUIRE(n == 1);
}

TEST_CASE("a task freeing the last view of a tensor while its stream shuts down does not throw",
          "[unit]") {
  // The block was allocated on `s`, so freeing it records an event on `s`. When that free
  // happens in a task's destructor while `s` drains in its own destructor, recording must still
  // work (it used to raise "enqueue after shutdown" out of a destructor: std::terminate).
  auto alloc = make_host_caching_allocator();
  std::atomic<int> ran{0};
  {
    auto s = make_host_stream("dying");
    Tensor t = Tensor::empty(Shape{4096}, DType::f32, alloc, s.get());
    // Keep the worker busy so the next task is still queued when the destructor starts.
    s->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
    s->enqueue([t, &ran] { ran.fetch_add(1); });
    t = Tensor();  // the queued task holds the last view
  }                // ~HostStream drains the queue; the task's captures are freed there
  CHECK(ran.load() == 1);
  CHECK(alloc->stats().allocated_bytes == 0);
}

TEST_CASE("launch blocking returns after the task ran and released its captures", "[stream]") {
  auto s = make_host_stream_blocking("blocking", true);
  std::atomic<int> ran{0};
  auto owner = std::make_shared<int>(3);
  std::weak_ptr<int> w = owner;
  s->enqueue([&ran, o = std::move(owner)] {
    std::this_thread::sleep_for(20ms);  // a slow task: a queue would return before it ran
    ran += *o;
  });
  CHECK(ran == 3);
  CHECK(w.expired());
  // A task that enqueues on another blocking stream (as freeing a tensor records an event on its
  // stream) does not wait for it: two workers never block on each other.
  auto other = make_host_stream_blocking("other", true);
  Event e = s->record();
  other->wait(e);
  s->enqueue([&] { other->enqueue([&ran] { ran += 1; }); });
  other->synchronize();
  CHECK(ran == 4);
  // Under NonBlockingEnqueue (what the Communicator issues under) a blocking stream queues.
  {
    NonBlockingEnqueue queued;
    std::atomic<bool> open{false};
    s->enqueue([&] {
      while (!open) std::this_thread::sleep_for(100us);
      ran += 100;
    });
    CHECK(ran == 4);
    open = true;
    s->synchronize();
    CHECK(ran == 104);
  }
  ran = 4;
  // The same work on a queueing stream returns before it runs.
  auto q = make_host_stream_blocking("queue", false);
  std::atomic<bool> gate{false};
  q->enqueue([&] {
    while (!gate) std::this_thread::sleep_for(100us);
  });
  q->enqueue([&ran] { ran += 10; });
  CHECK(ran == 4);
  gate = true;
  q->synchronize();
  CHECK(ran == 14);
}

TEST_CASE("MESHRT_LAUNCH_BLOCKING's override applies to streams created after it", "[stream]") {
  set_host_launch_blocking(1);
  CHECK(launch_blocking_from_env());
  auto s = make_host_stream("s");
  std::atomic<int> ran{0};
  s->enqueue([&ran] {
    std::this_thread::sleep_for(10ms);
    ran = 1;
  });
  CHECK(ran == 1);
  set_host_launch_blocking(0);
  CHECK(!launch_blocking_from_env());
  set_host_launch_blocking(-1);
}
