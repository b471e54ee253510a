// The CUDA backend of runtime/: GPU results against the host backend bit for bit, stream / event
// ordering, host events gating CUDA streams, the caching allocator, host <-> device copies. The
// [cuda] cases skip (saying why) where no GPU is usable; the [unit] case checks that a build
// with CUDA on a machine without a GPU or driver starts, says why, and runs on the CPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "tests/common/cuda_skip.h"

#if defined(MESHRT_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "backends/cuda/runtime/cuda_check.h"
#endif

using namespace meshrt;
using namespace std::chrono_literals;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16,
                                DType::i32, DType::i64,  DType::u8};

// Stores v into element i of a contiguous host tensor, converting as the runtime does.
void put(const Tensor& t, int64_t i, double v) {
  void* p = t.data_ptr();
  switch (t.dtype()) {
    case DType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(static_cast<float>(v));
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(static_cast<float>(v));
      return;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      return;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      return;
  }
}

// Source values for a conversion src -> dst whose result C++ defines (float -> integer only in
// range; the GPU saturates where the host's behaviour is undefined) and that reach the edge cases:
// NaN, infinities, signed zero, f32 and f16 subnormals, f16 overflow, rounding ties, large
// integers.
double test_value(DType src, DType dst, int64_t i) {
  if (is_floating(src)) {
    if (is_floating(dst)) {
      static const double kSpecial[] = {0.0,
                                        -0.0,
                                        1.0,
                                        -1.5,
                                        65504.0,
                                        65520.0,
                                        1e-7,
                                        5.960464477539063e-8,
                                        2.9802322387695312e-8,
                                        1e-40,
                                        3.4e38,
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        std::numeric_limits<double>::quiet_NaN(),
                                        1.00390625,
                                        1.0009765625};
      constexpr int64_t kN = sizeof(kSpecial) / sizeof(kSpecial[0]);
      if (i < kN) return kSpecial[i];
      const double mant = 1.0 + static_cast<double>((i * 2654435761u) % 1000003u) / 1000003.0;
      const int exp = static_cast<int>((i * 7) % 61) - 30;
      return (i % 3 == 0 ? -1.0 : 1.0) * std::ldexp(mant, exp);
    }
    const double lo = dst == DType::u8 ? 0.0 : -1000.0, hi = dst == DType::u8 ? 250.0 : 1000.0;
    return lo + std::fmod(static_cast<double>(i) * 37.37, hi - lo);
  }
  switch (src) {
    case DType::u8:
      return static_cast<double>((i * 37) % 256);
    case DType::i32:
      return static_cast<double>((i * 2654435761LL) % 2147483647LL - 1073741823LL);
    default:  // i64: beyond 2^24 and 2^31, exactly representable in a double
      return (i % 2 ? -1.0 : 1.0) * static_cast<double>((int64_t{1} << 40) + i * 1234567);
  }
}

Tensor host_tensor(Context& cpu, const Shape& shape, DType dt, DType dst_for_values) {
  Tensor t = cpu.empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) put(t, i, test_value(dt, dst_for_values, i));
  return t;
}

// A host copy of t (any device), after all work on `s`.
Tensor fetch(const Tensor& t, Context& ctx) {
  Stream& s = ctx.compute_stream();
  Tensor h = t.device().is_cpu() ? t.contiguous(s) : t.to(ctx.host_allocator(), s);
  ctx.synchronize();
  return h;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  REQUIRE(a.is_contiguous());
  REQUIRE(b.is_contiguous());
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  return std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Index of the first differing element (for messages), or -1.
int64_t first_difference(const Tensor& a, const Tensor& b) {
  const size_t es = a.element_size();
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(b.data_ptr());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + static_cast<size_t>(i) * es, pb + static_cast<size_t>(i) * es, es) != 0)
      return i;
  return -1;
}

}  // namespace

TEST_CASE("a CUDA-enabled build without a usable GPU says why and runs on the CPU", "[unit]") {
  std::string why;
  const bool available = cuda_available(&why);
#if defined(MESHRT_WITH_CUDA)
  REQUIRE(cuda_backend() != nullptr);
  REQUIRE(cuda_backend()->type() == DeviceType::CUDA);
  // Must not crash or throw without a driver; names the runtime either way.
  const std::string versions = cuda_backend()->versions();
  INFO("versions: " << versions);
  REQUIRE(versions.find("CUDA runtime") != std::string::npos);
  // The check macro names the call, the error and the place.
  try {
    MESHRT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("MESHRT_CUDA_CHECK did not throw");
  } catch (const Error& e) {
    const std::string msg = e.what();
    REQUIRE(msg.find("cudaErrorInvalidValue") != std::string::npos);
    REQUIRE(msg.find("failed") != std::string::npos);
    REQUIRE(msg.find("test_cuda_runtime.cpp:") != std::string::npos);
  }
#else
  REQUIRE(cuda_backend() == nullptr);
  REQUIRE(!available);
#endif
  if (available) {
    REQUIRE(cuda_backend()->device_count(nullptr) > 0);
  } else {
    INFO("reason: " << why);
    REQUIRE(!why.empty());
    REQUIRE(lower(why).find("cuda") != std::string::npos);
    REQUIRE((cuda_backend() == nullptr || cuda_backend()->device_count(nullptr) == 0));
    // Asking for a GPU anyway fails with the reason, not with a crash.
    REQUIRE_THROWS_WITH(Context(Device::cuda(0)), Catch::Contains(why));
  }
  // The CPU path is unaffected.
  Context cpu(Device::cpu());
  Stream& s = cpu.compute_stream();
  Tensor a = host_tensor(cpu, {4, 5}, DType::f32, DType::f32);
  Tensor b = a.transpose(0, 1).contiguous(s).to(DType::bf16, s);
  Tensor z = cpu.zeros({3}, DType::i64);
  z.fill_(7, s);
  cpu.synchronize();
  REQUIRE(b.shape() == Shape({5, 4}));
  REQUIRE(b.item(1) ==
          static_cast<double>(bf16::from_float(static_cast<float>(a.item(5))).to_float()));
  REQUIRE(z.to_vector() == std::vector<double>{7, 7, 7});
}

TEST_CASE("CUDA copy_ converts every dtype pair exactly as the host does", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Context cpu(Device::cpu());
  Context gpu(Device::cuda(0));
  Stream& hs = cpu.compute_stream();
  Stream& gs = gpu.compute_stream();
  const Shape shape{3, 5, 67};
  for (DType src : kAllDTypes) {
    for (DType dst : kAllDTypes) {
      INFO(dtype_name(src) << " -> " << dtype_name(dst));
      Tensor h = host_tensor(cpu, shape, src, dst);
      Tensor d = h.to(gpu.allocator_ptr(), gs);  // host -> device
      // Contiguous conversion, then strided source (transposed), then strided destination.
      Tensor want = h.to(dst, hs);
      Tensor want_t = h.transpose(0, 2).contiguous(hs).to(dst, hs);
      Tensor want_n = h.narrow(2, 3, 60).contiguous(hs).to(dst, hs);
      Tensor got = d.to(dst, gs);
      Tensor got_t = Tensor::empty(want_t.shape(), dst, gpu.allocator_ptr(), &gs);
      got_t.copy_(d.transpose(0, 2), gs);
      Tensor got_n_storage = Tensor::empty({3, 5, 70}, dst, gpu.allocator_ptr(), &gs);
      Tensor got_n = got_n_storage.narrow(2, 5, 60);
      got_n.copy_(d.narrow(2, 3, 60), gs);
      cpu.synchronize();
      Tensor r = fetch(got, gpu), rt = fetch(got_t, gpu), rn = fetch(got_n, gpu);
      INFO("first difference: contiguous " << first_difference(r, want) << ", transposed "
                                           << first_difference(rt, want_t) << ", narrowed "
                                           << first_difference(rn, want_n));
      REQUIRE(same_bytes(r, want));
      REQUIRE(same_bytes(rt, want_t));
      REQUIRE(same_bytes(rn, want_n));
    }
  }
}

TEST_CASE("CUDA fill_ writes the host's values into contiguous and strided views", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Context cpu(Device::cpu());
  Context gpu(Device::cuda(0));
  Stream& hs = cpu.compute_stream();
  Stream& gs = gpu.compute_stream();
  for (DType dt : kAllDTypes) {
    for (double v : {0.0, -0.0, 1.5, -3.25, 100.0, 1e10, 1.0 / 3.0}) {
      if (!is_floating(dt) && (v < 0 || v > 200)) continue;  // out of range: undefined on host
      INFO(dtype_name(dt) << " fill " << v);
      Tensor h = cpu.zeros({6, 9}, dt);
      Tensor d = gpu.zeros({6, 9}, dt);
      h.fill_(v, hs);
      d.fill_(v, gs);
      Tensor h2 = cpu.zeros({6, 9}, dt);
      Tensor d2 = gpu.zeros({6, 9}, dt);
      h2.narrow(1, 2, 5).transpose(0, 1).fill_(v, hs);  // strided, with gaps
      d2.narrow(1, 2, 5).transpose(0, 1).fill_(v, gs);
      cpu.synchronize();
      REQUIRE(same_bytes(fetch(d, gpu), h));
      REQUIRE(same_bytes(fetch(d2, gpu), h2));
    }
  }
}

TEST_CASE("CUDA Philox init equals the host's values and shards equal slices of the full tensor",
          "[cuda][philox]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Context cpu(Device::cpu());
  Context gpu(Device::cuda(0));
  Stream& hs = cpu.compute_stream();
  Stream& gs = gpu.compute_stream();
  const Shape full{37, 129};
  for (auto dist : {PhiloxInit::Dist::Uniform, PhiloxInit::Dist::Normal}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const bool uniform = dist == PhiloxInit::Dist::Uniform;
      INFO(dtype_name(dt) << (uniform ? " uniform" : " normal"));
      PhiloxInit init{20240611, 3, dist, uniform ? -0.3f : 0.1f, uniform ? 0.7f : 0.02f};
      Tensor whole = cpu.empty(full, dt);
      whole.init_philox_(init, hs);
      Tensor g = gpu.empty(full, dt);
      g.init_philox_(init, gs);
      // A shard at an offset, and a strided (transposed) destination.
      Tensor shard = gpu.empty({16, 65}, dt);
      shard.init_philox_(init, full, {5, 64}, gs);
      Tensor tr = Tensor::empty({129, 37}, dt, gpu.allocator_ptr(), &gs).transpose(0, 1);
      tr.init_philox_(init, gs);
      cpu.synchronize();
      Tensor want_shard = whole.narrow(0, 5, 16).narrow(1, 64, 65).contiguous(hs);
      hs.synchronize();
      Tensor rg = fetch(g, gpu), rs = fetch(shard, gpu), rt = fetch(tr, gpu);
      // Both distributions use meshrt's own log / cos from correctly rounded +, -, *, /
      // (runtime/philox.h), so the device values equal the host's bit for bit.
      REQUIRE(same_bytes(rg, whole));
      REQUIRE(same_bytes(rs, want_shard));
      REQUIRE(same_bytes(rt, whole));
    }
  }
}

TEST_CASE("CUDA streams run host functions in order and report their errors once", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  auto s = cuda_backend()->create_stream(0, "s");
  REQUIRE(s->device() == Device::cuda(0));
  REQUIRE(s->native_handle() != nullptr);
  std::vector<int> seen;
  for (int i = 0; i < 2000; ++i) s->enqueue([&seen, i] { seen.push_back(i); });
  s->synchronize();
  REQUIRE(seen.size() == 2000);
  for (int i = 0; i < 2000; ++i) REQUIRE(seen[static_cast<size_t>(i)] == i);

  Event before = s->record();
  s->enqueue([] { MESHRT_FAIL("boom in a host function"); });
  std::atomic<int> ran{0};
  s->enqueue([&] { ran++; });
  Event after = s->record();
  REQUIRE_NOTHROW(before.synchronize());
  REQUIRE_THROWS_WITH(after.synchronize(), Catch::Contains("boom in a host function"));
  REQUIRE_THROWS_WITH(s->synchronize(), Catch::Contains("boom in a host function"));
  REQUIRE(ran == 1);
  REQUIRE_NOTHROW(s->synchronize());  // reported once; the stream is usable again
  REQUIRE_NOTHROW(s->record().synchronize());
}

TEST_CASE("a cross-device copy holds its storages behind an event until the copy ran", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Context gpu(Device::cuda(0));
  Stream& a = gpu.stream("a");
  auto host = make_host_stream_jitter("host", false);
  // A host allocator without stream-aware reuse: only the hold keeps the destination alive.
  auto plain = make_host_plain_allocator();
  Tensor x = Tensor::empty({1 << 20}, DType::f32, gpu.allocator_ptr(), &a);
  x.fill_(3.0, a);
  a.synchronize();
  std::atomic<bool> gate{false};
  host->enqueue([&] {
    while (!gate) std::this_thread::sleep_for(100us);
  });
  a.wait(host->record());  // the copy below waits behind the gate
  Tensor out = Tensor::empty(x.shape(), DType::f32, plain, &a);
  out.copy_(x, a);
  std::weak_ptr<Storage> held = out.storage();
  out = Tensor();  // the last user reference goes while the copy is still queued
  std::this_thread::sleep_for(20ms);
  REQUIRE(!held.expired());
  REQUIRE(plain->stats().live_blocks == 1);
  gate = true;
  a.synchronize();
  REQUIRE(held.expired());  // released by the stream's next call once its event completed
  REQUIRE(plain->stats().live_blocks == 0);
  // And the copy itself is right.
  Tensor back = Tensor::empty(x.shape(), DType::f32, plain, &a);
  back.copy_(x, a);
  a.synchronize();
  REQUIRE(back.item(4321) == 3.0);
}

TEST_CASE("CUDA events order streams, carry errors across waits and time work", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Context gpu(Device::cuda(0));
  Stream& a = gpu.stream("a");
  Stream& b = gpu.stream("b");
  auto host = make_host_stream_jitter("host", false);

  // a is held by a host event for 100 ms, then writes 7; b copies the result out after waiting
  // for a, and a copy without the wait sees the old value: both the gate and the wait are real.
  Tensor x = Tensor::empty({1 << 20}, DType::f32, gpu.allocator_ptr(), &a);
  x.fill_(1.0, a);
  a.synchronize();
  host->enqueue([] { std::this_thread::sleep_for(100ms); });
  a.wait(host->record());
  Event start = a.record_timed();
  x.fill_(7.0, a);
  Event done = a.record_timed();
  Tensor early = Tensor::empty(x.shape(), DType::f32, gpu.host_allocator(), &b);
  early.copy_(x, b);  // no wait: runs while a is still held
  b.synchronize();
  REQUIRE(!done.query());
  b.wait(done);
  Tensor late = Tensor::empty(x.shape(), DType::f32, gpu.host_allocator(), &b);
  late.copy_(x, b);
  b.synchronize();
  REQUIRE(done.query());
  REQUIRE(early.item(12345) == 1.0);
  REQUIRE(late.item(12345) == 7.0);
  REQUIRE(late.item((1 << 20) - 1) == 7.0);
  REQUIRE(done.elapsed_ms(start) >= 0.f);
  // record() makes pooled timing-free events: timing them is refused, saying what to use.
  Event plain = a.record();
  plain.synchronize();
  REQUIRE_THROWS_WITH(plain.elapsed_ms(start), Catch::Matchers::Contains("record_timed"));

  // A host stream waits for a CUDA event: its next task sees the event complete and the data.
  x.fill_(3.0, a);
  Event filled = a.record();
  host->wait(filled);
  std::atomic<bool> complete_when_run{false};
  host->enqueue([&] { complete_when_run = filled.query(); });
  host->synchronize();
  REQUIRE(complete_when_run);
  Tensor back = x.narrow(0, 77, 1).to(gpu.host_allocator(), b);
  b.synchronize();
  REQUIRE(back.item(0) == 3.0);

  // Errors travel through waits: host event -> CUDA stream, CUDA event -> CUDA stream.
  host->enqueue([] { MESHRT_FAIL("boom on the host stream"); });
  a.wait(host->record());
  b.wait(a.record());
  Event b_end = b.record();
  REQUIRE_THROWS_WITH(b_end.synchronize(), Catch::Contains("boom on the host stream"));
  REQUIRE_THROWS_WITH(a.synchronize(), Catch::Contains("boom on the host stream"));
  REQUIRE_THROWS_WITH(b.synchronize(), Catch::Contains("boom on the host stream"));
  REQUIRE_THROWS(host->synchronize());
  REQUIRE_NOTHROW(a.synchronize());
  REQUIRE_NOTHROW(b.synchronize());
}

TEST_CASE("a CUDA stream held by a host event does not stall other streams' host functions",
          "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  // Host functions of all streams may share one driver thread: blocking it to wait for a host
  // event would deadlock here (the host event waits for b's host function). The gate does not.
  auto a = cuda_backend()->create_stream(0, "a");
  auto b = cuda_backend()->create_stream(0, "b");
  auto host = make_host_stream_jitter("host", false);
  std::atomic<bool> b_ran{false}, timed_out{false}, a_after{false};
  host->enqueue([&] {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!b_ran && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    timed_out = !b_ran;
  });
  a->wait(host->record());
  a->enqueue([&] { a_after = true; });
  b->enqueue([&] { b_ran = true; });
  b->synchronize();
  a->synchronize();
  REQUIRE(!timed_out);
  REQUIRE(a_after);
}

TEST_CASE("CUDA caching allocator reuses blocks only after their streams' work", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  auto alloc = cuda_backend()->create_caching_allocator(0);
  auto s1 = cuda_backend()->create_stream(0, "s1");
  auto s2 = cuda_backend()->create_stream(0, "s2");
  auto host = make_host_stream_jitter("host", false);
  REQUIRE(alloc->device() == Device::cuda(0));

  void* p = alloc->allocate(1 << 20, s1.get());
  alloc->deallocate(p);
  void* q = alloc->allocate(1 << 20, s1.get());
  REQUIRE(q == p);  // same stream: reuse at once, the stream orders old and new users
  REQUIRE(alloc->stats().cache_hits == 1);

  // s2 uses q and is held by a host event: q must not be handed out before s2 got past it.
  std::atomic<bool> release{false};
  host->enqueue([&] {
    while (!release) std::this_thread::sleep_for(100us);
  });
  alloc->record_stream(q, *s2);
  s2->wait(host->record());
  s2->enqueue([] {});
  alloc->deallocate(q);
  void* r = alloc->allocate(1 << 20, s1.get());
  REQUIRE(r != q);
  release = true;
  s2->synchronize();
  void* t = alloc->allocate(1 << 20, s1.get());
  REQUIRE(t == q);
  alloc->deallocate(r);
  alloc->deallocate(t);
  s1->synchronize();
  auto st = alloc->stats();
  REQUIRE(st.live_blocks == 0);
  REQUIRE(st.allocated_bytes == 0);
  REQUIRE(st.system_allocs == 2);
  REQUIRE(st.reserved_bytes == 2 * static_cast<int64_t>(allocator_size_class(1 << 20)));
  alloc->empty_cache();
  REQUIRE(alloc->stats().reserved_bytes == 0);

  // Tensors give their memory back; a too-large request fails with a message, not a crash.
  Context gpu(Device::cuda(0));
  {
    Tensor a = gpu.zeros({1024, 1024}, DType::bf16);
    Tensor b = a.to(DType::f32, gpu.compute_stream());
  }
  gpu.synchronize();
  REQUIRE(gpu.allocator().stats().live_blocks == 0);
  REQUIRE_THROWS_WITH(gpu.empty({int64_t{1} << 50}, DType::u8), Catch::Contains("out of memory"));
  REQUIRE_NOTHROW(gpu.zeros({16}, DType::f32));
}

TEST_CASE("host <-> device copies round-trip on CUDA and host streams", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Context cpu(Device::cpu());
  Context gpu(Device::cuda(0));
  Stream& gs = gpu.compute_stream();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3} << 20}) {
    INFO("elements: " << n);
    Tensor h = host_tensor(cpu, {n}, DType::i64, DType::i64);
    Tensor d = h.to(gpu.allocator_ptr(), gs);
    Tensor d2 = Tensor::empty({n}, DType::i64, gpu.allocator_ptr(), &gs);
    d2.copy_(d, gs);  // device -> device
    Tensor back = d2.to(cpu.allocator_ptr(), gs);
    gs.synchronize();
    REQUIRE(same_bytes(back, h));
  }
  // Device work ordered by a host stream (an embedding engine without CUDA streams at hand).
  Stream& hs = cpu.compute_stream();
  Tensor d = Tensor::empty({4, 8}, DType::f16, gpu.allocator_ptr(), &gs);
  gs.synchronize();
  d.fill_(2.5, hs);
  d.narrow(1, 0, 4).fill_(-1.0, hs);
  Tensor out = d.transpose(0, 1).to(cpu.allocator_ptr(), hs);
  hs.synchronize();
  REQUIRE(out.shape() == Shape({8, 4}));
  REQUIRE(out.item(0) == -1.0);
  REQUIRE(out.item(31) == 2.5);
  // Overlapping views of one buffer copy like memmove, as on the host.
  Tensor hb = host_tensor(cpu, {1000}, DType::f32, DType::f32);
  Tensor db = hb.to(gpu.allocator_ptr(), gs);
  hb.narrow(0, 0, 900).copy_(hb.narrow(0, 100, 900), hs);
  db.narrow(0, 0, 900).copy_(db.narrow(0, 100, 900), gs);
  db.narrow(0, 150, 850).copy_(db.narrow(0, 0, 850), gs);
  hb.narrow(0, 150, 850).copy_(hb.narrow(0, 0, 850), hs);
  hs.synchronize();
  REQUIRE(same_bytes(fetch(db, gpu), hb));
  // Empty tensors move nothing and do not fail.
  Tensor e = gpu.empty({0, 3}, DType::f32);
  REQUIRE(e.to(cpu.allocator_ptr(), gs).numel() == 0);
  if (cuda_backend()->device_count(nullptr) >= 2) {  // peer copies
    Context gpu1(Device::cuda(1));
    Tensor h = host_tensor(cpu, {4096}, DType::f32, DType::f32);
    Tensor on1 = h.to(gpu1.allocator_ptr(), gs).to(gpu.allocator_ptr(), gs);
    Tensor r = on1.to(cpu.allocator_ptr(), gs);
    gs.synchronize();
    REQUIRE(same_bytes(r, h));
  }
}

#if defined(MESHRT_WITH_CUDA)
TEST_CASE("an engine's cudaStream_t is wrapped without taking ownership", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  MESHRT_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t raw = nullptr;
  MESHRT_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  {
    ContextOptions o;
    o.external_stream = raw;
    Context gpu(Device::cuda(0), o);
    REQUIRE(gpu.compute_stream().native_handle() == static_cast<void*>(raw));
    Tensor t = gpu.zeros({256}, DType::f32);
    t.fill_(4.0, gpu.compute_stream());
    REQUIRE(fetch(t, gpu).item(255) == 4.0);
  }
  REQUIRE(cudaStreamQuery(raw) == cudaSuccess);  // still alive: the wrapper did not destroy it
  MESHRT_CUDA_CHECK(cudaStreamDestroy(raw));
  // The legacy default stream (a null handle) can be wrapped too.
  auto legacy = cuda_backend()->wrap_stream(0, nullptr, "default");
  REQUIRE(legacy->native_handle() != nullptr);
  legacy->synchronize();
}
#endif
