// HandlePool (runtime/event_pool.h), the CUDA event pool's logic, with fake handles on the CPU.
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "runtime/event_pool.h"

using meshrt::HandlePool;

namespace {

struct Fake {
  int next = 1;
  std::multiset<int> live;  // created, not destroyed
  std::shared_ptr<HandlePool<int>> pool() {
    return std::make_shared<HandlePool<int>>(
        [this] {
          live.insert(next);
          return next++;
        },
        [this](int h) { live.erase(live.find(h)); });
  }
};

}  // namespace

TEST_CASE("event pool reuses released handles instead of creating new ones", "[unit]") {
  Fake f;
  auto p = f.pool();
  // What recording on every free looks like: record, wait, drop, many times over.
  for (int i = 0; i < 1000; ++i) {
    const int a = p->acquire();
    const int b = p->acquire();
    CHECK(a != b);
    p->release(a);
    p->release(b);
  }
  CHECK(p->created() == 2);
  CHECK(p->idle() == 2);
  CHECK(f.live.size() == 2);
}

TEST_CASE("event pool destroys exactly the handles it holds when it goes", "[unit]") {
  Fake f;
  auto p = f.pool();
  std::vector<int> held;
  for (int i = 0; i < 5; ++i) held.push_back(p->acquire());
  for (int i = 0; i < 3; ++i) p->release(held[static_cast<size_t>(i)]);
  CHECK(p->created() == 5);
  p.reset();
  // The three released were destroyed; the two still held belong to their owners.
  CHECK(f.live == std::multiset<int>{held[3], held[4]});
}

TEST_CASE("event pool hands each handle to one owner at a time across threads", "[unit]") {
  std::atomic<int> next{1};
  HandlePool<int> p([&] { return next++; }, [](int) {});
  std::vector<std::atomic<int>> owners(4096);
  std::atomic<bool> clash{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        const int h = p.acquire();
        if (owners[static_cast<size_t>(h)].fetch_add(1) != 0) clash = true;
        owners[static_cast<size_t>(h)].fetch_sub(1);
        p.release(h);
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK_FALSE(clash.load());
  CHECK(p.created() <= 4);  // never more live at once than threads
}
