#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

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

// ---- stream-ordered reuse (issue 29): host tasks capture blocks as CUDA kernels do -------------

namespace {

// A host function that holds `s` until the returned promise is set: work queued after it stays
// queued (no timing involved).
std::promise<void> block_stream(Stream& s) {
  std::promise<void> gate;
  s.enqueue([f = gate.get_future().share()] { f.wait(); });
  return gate;
}

bool all_equal(const Tensor& t, double v) {
  for (double x : t.to_vector())
    if (x != v) return false;
  return true;
}

}  // namespace

TEST_CASE("a block freed with queued same-stream work is reused at once by that stream",
          "[allocator][stream]") {
  auto a = make_host_caching_allocator();
  auto s = make_host_stream_jitter("s", stream_jitter_from_env());
  const int64_t cls = static_cast<int64_t>(allocator_size_class(4096));
  std::promise<void> gate = block_stream(*s);
  Tensor x = Tensor::empty({1024}, DType::f32, a, s.get());
  Tensor out = Tensor::empty({1024}, DType::f32, a, s.get());
  x.fill_(3.0, *s);
  out.copy_(x, *s);  // queued: reads x after the gate opens
  void* px = x.data_ptr();
  x = Tensor();  // the program's last handle: the queued tasks do not own the block
  REQUIRE(a->stats().allocated_bytes == cls);
  REQUIRE(a->stats().live_blocks == 1);
  Tensor y = Tensor::empty({1024}, DType::f32, a, s.get());
  REQUIRE(y.data_ptr() == px);  // reused while the tasks that use x are still queued
  REQUIRE(a->stats().system_allocs == 2);
  y.fill_(7.0, *s);
  gate.set_value();
  s->synchronize();
  REQUIRE(all_equal(out, 3.0));  // the copy read x before y's fill overwrote the block
  REQUIRE(all_equal(y, 7.0));
  REQUIRE(a->stats().peak_allocated_bytes == 2 * cls);
}

TEST_CASE("another stream gets a freed block only once the queued work that used it ran",
          "[allocator][stream]") {
  auto a = make_host_caching_allocator();
  auto s1 = make_host_stream_jitter("s1", stream_jitter_from_env());
  auto s2 = make_host_stream_jitter("s2", stream_jitter_from_env());
  std::promise<void> gate = block_stream(*s1);
  Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
  x.fill_(5.0, *s1);
  void* px = x.data_ptr();
  x = Tensor();
  Tensor other = Tensor::empty({1024}, DType::f32, a, s2.get());
  REQUIRE(other.data_ptr() != px);  // s1's queued fill still writes px
  gate.set_value();
  s1->synchronize();
  Tensor later = Tensor::empty({1024}, DType::f32, a, s2.get());
  REQUIRE(later.data_ptr() == px);  // s1 passed the free: any stream may take it
  REQUIRE(a->stats().system_allocs == 2);
}

TEST_CASE("a block used by queued work on another stream is not reused before that work ran",
          "[allocator][stream]") {
  // x is allocated on s1 and read by a copy queued on s2 (Tensor::stream_ref records s2):
  // even s1, its allocation stream, must not get it back before s2 ran the copy.
  auto a = make_host_caching_allocator();
  auto s1 = make_host_stream_jitter("s1", stream_jitter_from_env());
  auto s2 = make_host_stream_jitter("s2", stream_jitter_from_env());
  Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
  x.fill_(2.0, *s1);
  s1->synchronize();
  std::promise<void> gate = block_stream(*s2);
  Tensor out = Tensor::empty({1024}, DType::f32, a, s2.get());
  out.copy_(x, *s2);
  void* px = x.data_ptr();
  x = Tensor();
  Tensor y = Tensor::empty({1024}, DType::f32, a, s1.get());
  REQUIRE(y.data_ptr() != px);
  y.fill_(9.0, *s1);
  s1->synchronize();  // y's fill ran; it did not touch x's block
  gate.set_value();
  s2->synchronize();
  REQUIRE(all_equal(out, 2.0));
  Tensor z = Tensor::empty({1024}, DType::f32, a, s1.get());
  REQUIRE(z.data_ptr() == px);
}

TEST_CASE("storages of allocators without stream-ordered reuse stay owned by queued tasks",
          "[allocator][stream]") {
  auto a = make_host_plain_allocator();
  REQUIRE_FALSE(a->stream_ordered());
  REQUIRE(make_host_caching_allocator()->stream_ordered());
  auto s = make_host_stream_jitter("s", stream_jitter_from_env());
  std::promise<void> gate = block_stream(*s);
  Tensor x = Tensor::empty({1024}, DType::f32, a, s.get());
  x.fill_(1.0, *s);
  x = Tensor();
  REQUIRE(a->stats().live_blocks == 1);  // the queued fill holds it
  gate.set_value();
  s->synchronize();
  REQUIRE(a->stats().live_blocks == 0);
}

TEST_CASE("stream-ordered reuse gives the program-order results under jitter",
          "[allocator][stream]") {
  // A chain of fills and copies that frees each step's input right away, all queued behind a
  // gate: every allocation on s reuses a block whose last readers are still queued. A second
  // stream takes snapshots after events. The values are those of the program order, whatever
  // the delays, and the footprint does not depend on them (nothing runs before the gate opens).
  auto a = make_host_caching_allocator();
  auto s = make_host_stream_jitter("s", true);
  auto t = make_host_stream_jitter("t", true);
  constexpr int kSteps = 200, kEvery = 10;
  std::promise<void> gate = block_stream(*s);
  std::vector<Tensor> kept;
  Tensor cur = Tensor::empty({256}, DType::f32, a, s.get());
  cur.fill_(0.0, *s);
  for (int i = 1; i <= kSteps; ++i) {
    Tensor next = Tensor::empty({256}, DType::f32, a, s.get());
    next.copy_(cur, *s);
    Tensor bump = Tensor::empty({256}, DType::f32, a, s.get());
    bump.fill_(static_cast<double>(i), *s);
    next.copy_(bump, *s);  // next = i, read from a block freed right after
    if (i % kEvery == 0) {
      Tensor snap = Tensor::empty({256}, DType::f32, a, t.get());
      t->wait(s->record());
      snap.copy_(next, *t);  // next is now also used on t: s may not reuse it at once
      kept.push_back(snap);
    }
    cur = next;
  }
  // Without stream-ordered reuse every step's two blocks stay held by the queued tasks (401
  // system allocations); with it: cur, next and bump circulate, plus each snapshot and each
  // block read by a snapshot.
  const int64_t snaps = kSteps / kEvery;
  REQUIRE(a->stats().system_allocs <= 3 + 2 * snaps);
  gate.set_value();
  s->synchronize();
  t->synchronize();
  REQUIRE(all_equal(cur, static_cast<double>(kSteps)));
  REQUIRE(kept.size() == static_cast<size_t>(snaps));
  for (size_t j = 0; j < kept.size(); ++j)
    REQUIRE(all_equal(kept[j], static_cast<double>(kEvery) * static_cast<double>(j + 1)));
}

TEST_CASE("keep_forever takes a block out of circulation, held, pending or cached",
          "[allocator][stream]") {
  // A collective that failed after an abort keeps its buffers this way: a peer may still write
  // them. Its handles are stream_refs, which own nothing, so the allocator must be told.
  auto a = make_host_caching_allocator();
  auto s1 = make_host_stream_jitter("s1", stream_jitter_from_env());
  auto s2 = make_host_stream_jitter("s2", stream_jitter_from_env());
  auto reused = [&](void* p) {
    // Every allocation of the class, on either stream, after all work ran.
    s1->synchronize();
    s2->synchronize();
    std::vector<Tensor> got;
    for (int i = 0; i < 4; ++i) {
      got.push_back(Tensor::empty({1024}, DType::f32, a, i % 2 ? s1.get() : s2.get()));
      if (got.back().data_ptr() == p) return true;
    }
    return false;
  };
  SECTION("the program still holds it") {
    Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
    x.stream_ref(*s2).keep_forever();
    void* p = x.data_ptr();
    x = Tensor();
    REQUIRE_FALSE(reused(p));
  }
  SECTION("freed, with work queued on another stream") {
    Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
    std::promise<void> gate = block_stream(*s2);
    Tensor ref = x.stream_ref(*s2);
    void* p = x.data_ptr();
    x = Tensor();  // pending on s2's event
    ref.keep_forever();
    gate.set_value();
    REQUIRE_FALSE(reused(p));
  }
  SECTION("freed and cached") {
    Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
    Tensor ref = x.stream_ref(*s1);
    void* p = x.data_ptr();
    x = Tensor();
    s1->synchronize();
    ref.keep_forever();
    REQUIRE_FALSE(reused(p));
  }
  SECTION("an owning handle") {
    Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
    x.keep_forever();
    void* p = x.data_ptr();
    x = Tensor();
    REQUIRE(a->stats().live_blocks == 1);  // the kept handle still owns it
    REQUIRE_FALSE(reused(p));
  }
  // Control: without keep_forever the same sequence reuses the block.
  SECTION("control") {
    Tensor x = Tensor::empty({1024}, DType::f32, a, s1.get());
    void* p = x.data_ptr();
    x = Tensor();
    REQUIRE(reused(p));
  }
}
