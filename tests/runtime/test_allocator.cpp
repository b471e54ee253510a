#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/context.h"
#include "runtime/error.h"

using namespace meshrt;

TEST_CASE("size classes round up by at most 25%", "[allocator]") {
  REQUIRE(allocator_size_class(1) == 64);
  REQUIRE(allocator_size_class(64) == 64);
  for (size_t b : {65ul, 100ul, 1000ul, 4097ul, 1ul << 20, (1ul << 20) + 1, 123456789ul}) {
    size_t c = allocator_size_class(b);
    REQUIRE(c >= b);
    REQUIRE(c % 64 == 0);
    REQUIRE(static_cast<double>(c) <= 1.25 * static_cast<double>(b) + 64);
    REQUIRE(allocator_size_class(c) == c);
  }
}

TEST_CASE("host caching allocator reuses blocks and keeps exact stats", "[allocator]") {
  auto a = make_host_caching_allocator();
  void* p = a->allocate(1000, nullptr);
  REQUIRE(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  auto st = a->stats();
  REQUIRE(st.allocated_bytes == static_cast<int64_t>(allocator_size_class(1000)));
  REQUIRE(st.system_allocs == 1);
  a->deallocate(p);
  REQUIRE(a->stats().allocated_bytes == 0);
  void* q = a->allocate(990, nullptr);  // same class
  REQUIRE(q == p);
  REQUIRE(a->stats().cache_hits == 1);
  void* r = a->allocate(5000, nullptr);
  REQUIRE(r != q);
  st = a->stats();
  REQUIRE(st.peak_allocated_bytes ==
          static_cast<int64_t>(allocator_size_class(1000) + allocator_size_class(5000)));
  REQUIRE(st.live_blocks == 2);
  a->deallocate(q);
  a->deallocate(r);
  st = a->stats();
  REQUIRE(st.live_blocks == 0);
  REQUIRE(st.allocated_bytes == 0);
  REQUIRE(st.reserved_bytes > 0);
  a->empty_cache();
  REQUIRE(a->stats().reserved_bytes == 0);
  REQUIRE_THROWS_WITH(a->deallocate(reinterpret_cast<void*>(0x1000)),
                      Catch::Contains("did not allocate"));
}

TEST_CASE("a block used on another stream is not reused before that work finishes",
          "[allocator][stream]") {
  auto a = make_host_caching_allocator();
  auto s1 = make_host_stream("s1"), s2 = make_host_stream("s2");
  std::atomic<bool> gate{false};
  void* p = a->allocate(4096, s1.get());
  a->record_stream(p, *s2);
  s2->enqueue([&] {
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  a->deallocate(p);
  // s2 still "uses" p: a new request of the same class must get other memory.
  void* q = a->allocate(4096, s1.get());
  REQUIRE(q != p);
  gate = true;
  s2->synchronize();
  s1->synchronize();
  void* r = a->allocate(4096, s1.get());
  REQUIRE(r == p);  // now the cached block is handed out
  a->deallocate(q);
  a->deallocate(r);
  REQUIRE(a->stats().live_blocks == 0);
}

TEST_CASE("same-stream reuse is immediate and tensors free their storage", "[allocator]") {
  Context ctx(Device::cpu());
  auto& alloc = ctx.allocator();
  {
    Tensor t = ctx.empty({256, 256}, DType::f32);
    t.fill_(1.0, ctx.compute_stream());
  }
  ctx.synchronize();
  auto st = alloc.stats();
  REQUIRE(st.live_blocks == 0);
  REQUIRE(st.allocated_bytes == 0);
  Tensor u = ctx.empty({256, 256}, DType::f32);
  REQUIRE(alloc.stats().cache_hits >= 1);
  REQUIRE(alloc.stats().system_allocs == 1);
}

TEST_CASE("many threads allocate and free concurrently without leaks", "[allocator]") {
  auto a = make_host_caching_allocator();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<void*> ps;
      for (int i = 0; i < 2000; ++i) {
        ps.push_back(a->allocate(static_cast<size_t>(64 * (1 + (i + t) % 37)), nullptr));
        if (ps.size() > 16) {
          a->deallocate(ps.front());
          ps.erase(ps.begin());
        }
      }
      for (void* p : ps) a->deallocate(p);
    });
  for (auto& t : ts) t.join();
  auto st = a->stats();
  REQUIRE(st.live_blocks == 0);
  REQUIRE(st.allocated_bytes == 0);
  REQUIRE(st.alloc_count == 8000);
  REQUIRE(st.cache_hits > 7000);
}

TEST_CASE("an engine can hand in its own allocator", "[allocator]") {
  struct Counting : Allocator {
    std::shared_ptr<Allocator> inner = make_host_plain_allocator();
    int allocs = 0, frees = 0;
    Device device() const override { return Device::cpu(); }
    void* allocate(size_t b, Stream* s) override {
      ++allocs;
      return inner->allocate(b, s);
    }
    void deallocate(void* p) override {
      ++frees;
      inner->deallocate(p);
    }
    AllocatorStats stats() const override { return inner->stats(); }
    std::string name() const override { return "engine"; }
  };
  auto eng = std::make_shared<Counting>();
  {
    ContextOptions o;
    o.allocator = eng;
    Context ctx(Device::cpu(), o);
    Tensor t = ctx.zeros({10}, DType::f32);
    ctx.synchronize();
    REQUIRE(t.item(3) == 0.0);
  }
  REQUIRE(eng->allocs == 1);
  REQUIRE(eng->frees == 1);
}
