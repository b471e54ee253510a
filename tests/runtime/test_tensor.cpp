#include <catch2/catch.hpp>

#include <cmath>
#include <future>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

using namespace meshrt;

namespace {

// A host tensor holding 0, 1, 2, ... in row-major order.
Tensor iota(Context& ctx, const Shape& s, DType dt = DType::f32) {
  Tensor t = ctx.empty(s, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i);
  return dt == DType::f32 ? t : t.to(dt, ctx.compute_stream());
}

}  // namespace

TEST_CASE("views share storage with the right strides", "[tensor]") {
  Context ctx(Device::cpu());
  Tensor t = iota(ctx, {4, 6});
  REQUIRE(t.is_contiguous());
  REQUIRE(t.strides() == Shape({6, 1}));

  Tensor n = t.narrow(1, 2, 3);
  REQUIRE(n.shape() == Shape({4, 3}));
  REQUIRE(!n.is_contiguous());
  REQUIRE(n.item(0) == 2);
  REQUIRE(n.item(4) == 9);  // row 1, col 1 of the view = element (1, 3)

  Tensor tr = t.transpose(0, 1);
  REQUIRE(tr.shape() == Shape({6, 4}));
  REQUIRE(tr.strides() == Shape({1, 6}));
  REQUIRE(tr.item(1) == 6);

  Tensor s = t.slice(1, 1, 6, 2);  // columns 1, 3, 5
  REQUIRE(s.shape() == Shape({4, 3}));
  REQUIRE(s.item(2) == 5);
  REQUIRE(s.item(3) == 7);

  auto ch = t.chunk(2, 0);
  REQUIRE(ch.size() == 2);
  REQUIRE(ch[1].item(0) == 12);
  REQUIRE(ch[1].storage() == t.storage());

  Tensor sel = t.select(0, 2);
  REQUIRE(sel.shape() == Shape({6}));
  REQUIRE(sel.item(5) == 17);

  Tensor v = t.view({2, -1, 3});
  REQUIRE(v.shape() == Shape({2, 4, 3}));
  REQUIRE(v.item(11) == 11);

  Tensor empty = ctx.empty({4, 0}, DType::f32);
  REQUIRE(empty.is_contiguous());
  REQUIRE(t.narrow(1, 2, 0).is_contiguous());
}

TEST_CASE("contiguous, reshape, to(dtype), fill and copy move data correctly", "[tensor]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  Tensor t = iota(ctx, {3, 5});
  Tensor tr = t.transpose(0, 1);  // [5, 3]
  Tensor c = tr.contiguous(s);
  s.synchronize();
  REQUIRE(c.is_contiguous());
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) REQUIRE(c.item(i * 3 + j) == j * 5 + i);

  Tensor r = tr.reshape({15}, s);
  s.synchronize();
  REQUIRE(r.item(1) == 5);

  Tensor h = t.to(DType::bf16, s).to(DType::f16, s).to(DType::i64, s);
  s.synchronize();
  REQUIRE(h.dtype() == DType::i64);
  REQUIRE(h.to_vector() == t.to_vector());

  Tensor z = ctx.zeros({2, 3}, DType::bf16);
  z.narrow(1, 1, 2).fill_(1.5, s);
  s.synchronize();
  REQUIRE(z.to_vector() == std::vector<double>{0, 1.5, 1.5, 0, 1.5, 1.5});

  Tensor dst = ctx.zeros({5, 3}, DType::f16);
  dst.copy_(tr, s);  // strided source, dtype conversion
  s.synchronize();
  REQUIRE(dst.to_vector() == c.to_vector());
}

TEST_CASE("fill with +0, -0 and values writes those bits in every dtype", "[tensor]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    Tensor t = ctx.empty({3, 70}, dt);
    t.fill_(7, s);
    t.narrow(1, 3, 60).fill_(0.0, s);  // rows of a strided view: +0 is all-zero bytes (memset)
    s.synchronize();
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 70; ++j)
        REQUIRE(t.item(i * 70 + j) == (j >= 3 && j < 63 ? 0.0 : 7.0));
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    const size_t es = dtype_size(dt);
    for (size_t b = 3 * es; b < 63 * es; ++b) REQUIRE(bytes[b] == 0);
  }
  // -0 keeps its sign bit (not a memset).
  Tensor n = ctx.empty({5}, DType::f32);
  n.fill_(-0.0, s);
  s.synchronize();
  for (int64_t i = 0; i < 5; ++i) REQUIRE(std::signbit(n.data<float>()[i]));
}

TEST_CASE("bad views and copies raise errors naming the values", "[tensor]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  Tensor t = ctx.empty({4, 6}, DType::f32);
  REQUIRE_THROWS_WITH(t.narrow(1, 4, 3), Catch::Contains("narrow(dim=1, start=4, length=3)"));
  REQUIRE_THROWS_WITH(t.narrow(2, 0, 1), Catch::Contains("dim 2 out of range"));
  REQUIRE_THROWS_WITH(t.chunk(4, 1), Catch::Contains("size 6 does not divide into 4"));
  REQUIRE_THROWS_WITH(t.view({5, 5}), Catch::Contains("25 elements vs 24"));
  REQUIRE_THROWS_WITH(t.transpose(0, 1).view({24}), Catch::Contains("non-contiguous"));
  REQUIRE_THROWS_WITH(t.select(0, 4), Catch::Contains("select(dim=0, index=4)"));
  REQUIRE_THROWS_WITH(t.data<double>(), Catch::Contains("sizeof(T)=8"));
  Tensor u = ctx.empty({6, 4}, DType::f32);
  REQUIRE_THROWS_WITH(u.copy_(t, s), Catch::Contains("copy_: shape [4, 6] into [6, 4]"));
  REQUIRE_THROWS_WITH(Shape({1, 2, 3, 4, 5, 6, 7, 8, 9}), Catch::Contains("at most 8"));
  Shape big{int64_t{1} << 40, int64_t{1} << 40};
  REQUIRE_THROWS_WITH(big.numel(), Catch::Contains("overflows int64"));
  REQUIRE_THROWS_WITH(ctx.empty({int64_t{1} << 62, 4}, DType::f32), Catch::Contains("overflow"));
}

TEST_CASE("from_blob wraps external memory and calls the deleter", "[tensor]") {
  static float buf[6] = {1, 2, 3, 4, 5, 6};
  int deleted = 0;
  {
    Tensor t = Tensor::from_blob(buf, {2, 3}, DType::f32, Device::cpu(), [&](void*) { ++deleted; });
    Tensor v = t.transpose(0, 1);
    REQUIRE(v.item(1) == 4);
  }
  REQUIRE(deleted == 1);
}

// The --dump failure of `meshrt bench block` (a heap-use-after-free under ASan): a rank copied a
// local vector through from_blob (no deleter), the all_gather after the copy threw because a peer
// had failed, and the unwinding freed the vector while the copy was still queued. Here the
// stream is held by a gate until the caller's buffer is gone, which is overwritten, as reused
// memory would be, so the check needs no sanitizer: the copy must read the values handed over.
TEST_CASE("a copy still queued when an exception unwinds past its source buffer reads its values",
          "[tensor]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  s.enqueue([gate] { gate.wait(); });
  Tensor d = ctx.empty({3}, DType::i64);
  std::vector<int64_t> buf = {7, 8, 9};
  try {
    Tensor h = Tensor::from_host_data(buf.data(), {3}, DType::i64);
    d.copy_(h, s);
    throw std::runtime_error("all_gather: a peer failed");
  } catch (const std::runtime_error&) {
  }
  std::fill(buf.begin(), buf.end(), int64_t{-1});  // the buffer's memory, reused
  open.set_value();
  s.synchronize();
  REQUIRE(d.to_vector() == std::vector<double>{7, 8, 9});
  REQUIRE_THROWS_WITH(Tensor::from_host_data(nullptr, {2}, DType::f32),
                      Catch::Contains("null data for a non-empty f32[2]"));
}

TEST_CASE("Philox init: a shard initialised alone equals the slice of the full tensor",
          "[tensor][philox]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  const Shape full{12, 16};
  for (auto dist : {PhiloxInit::Dist::Uniform, PhiloxInit::Dist::Normal}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      PhiloxInit init{1234, 7, dist, dist == PhiloxInit::Dist::Uniform ? -0.5f : 0.f, 0.02f};
      Tensor whole = ctx.empty(full, dt);
      whole.init_philox_(init, s);
      // Column shards (tp=4 over the output dim) and a 2-D block.
      for (int r = 0; r < 4; ++r) {
        Tensor shard = ctx.empty({12, 4}, dt);
        shard.init_philox_(init, full, {0, 4 * r}, s);
        s.synchronize();
        REQUIRE(shard.to_vector() == whole.narrow(1, 4 * r, 4).to_vector());
      }
      Tensor block = ctx.empty({3, 5}, dt);
      block.init_philox_(init, full, {6, 9}, s);
      s.synchronize();
      REQUIRE(block.to_vector() == whole.narrow(0, 6, 3).narrow(1, 9, 5).to_vector());
    }
  }
  // Different ids give different streams; same (seed, id) gives the same values.
  Tensor a = ctx.empty({64}, DType::f32), b = ctx.empty({64}, DType::f32),
         c = ctx.empty({64}, DType::f32);
  a.init_philox_({1, 1}, s);
  b.init_philox_({1, 2}, s);
  c.init_philox_({1, 1}, s);
  s.synchronize();
  REQUIRE(a.to_vector() == c.to_vector());
  REQUIRE(a.to_vector() != b.to_vector());
}

TEST_CASE("Philox distributions have the right moments", "[tensor][philox]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  const int64_t n = 1 << 16;
  Tensor u = ctx.empty({n}, DType::f32), g = ctx.empty({n}, DType::f32);
  u.init_philox_({42, 0, PhiloxInit::Dist::Uniform, 2.f, 4.f}, s);
  g.init_philox_({42, 1, PhiloxInit::Dist::Normal, 1.f, 3.f}, s);
  s.synchronize();
  double su = 0, sg = 0, sg2 = 0, mn = 1e9, mx = -1e9;
  for (int64_t i = 0; i < n; ++i) {
    double x = u.item(i), y = g.item(i);
    su += x;
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    sg += y;
    sg2 += y * y;
  }
  double mean_g = sg / n, var_g = sg2 / n - mean_g * mean_g;
  REQUIRE(su / n == Approx(3.0).margin(0.02));  // std of mean ~ 0.0023
  REQUIRE(mn >= 2.0);
  REQUIRE(mx < 4.0);
  REQUIRE(mean_g == Approx(1.0).margin(0.05));  // std of mean ~ 0.012
  REQUIRE(std::sqrt(var_g) == Approx(3.0).margin(0.05));
}

TEST_CASE("Philox log and cos are accurate (the shared host/device math)", "[tensor][philox]") {
  double worst_log = 0, worst_cos = 0;
  for (int i = 1; i <= 100000; ++i) {
    float u = static_cast<float>(i) / 100000.f;
    worst_log = std::max(worst_log, std::abs(philox_log(u) - std::log(static_cast<double>(u))));
    double c = std::cos(6.283185307179586 * static_cast<double>(u));
    worst_cos = std::max(worst_cos, std::abs(philox_cos2pi(u) - c));
  }
  REQUIRE(philox_log(1.f) == 0.f);
  REQUIRE(worst_log < 2e-6);
  REQUIRE(worst_cos < 2e-6);
}
