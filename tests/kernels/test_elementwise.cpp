// add / scale / sum of squares / cast / fill, bias + GeLU (forward, backward, finite
// differences), dropout.
#include <cmath>

#include "helpers.h"
#include "kernels/math.h"

using namespace kt;
namespace ops = meshrt::ops;

namespace {

double gelu_ref(double x, ops::GeluKind k) {
  if (k == ops::GeluKind::Tanh) {
    double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1 + std::tanh(u));
  }
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

double gelu_grad_ref(double x, ops::GeluKind k) {
  if (k == ops::GeluKind::Tanh) {
    double c = std::sqrt(2.0 / M_PI);
    double u = c * (x + 0.044715 * x * x * x);
    double t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

}  // namespace

TEST_CASE("add, scale, cast and fill match references", "[elementwise]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto n = GENERATE(int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{70001});
  Tensor a = rand_tensor(h, {n}, dt, 1), b = rand_tensor(h, {n}, dt, 2);
  Vec av = read(h, a), bv = read(h, b);
  Tensor out = h.ctx.empty({n}, dt);
  const double tol = tol_for(dt, 1e-6);

  ops::add(h.ctx, h.s(), a, b, out);
  Vec ref(av.size());
  for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] + bv[i];
  check_close(read(h, out), ref, tol, "add " + dt_name(dt), 0.0);

  ops::add(h.ctx, h.s(), a, b, out, 0.5f, -2.f);
  for (size_t i = 0; i < av.size(); ++i) ref[i] = 0.5 * av[i] - 2 * bv[i];
  check_close(read(h, out), ref, tol, "axpby " + dt_name(dt), 0.0);

  ops::scale(h.ctx, h.s(), a, out, 3.f);
  for (size_t i = 0; i < av.size(); ++i) ref[i] = 3 * av[i];
  check_close(read(h, out), ref, tol, "scale " + dt_name(dt), 0.0);

  // In place: a = a + b.
  Tensor a2 = make(h, {n}, dt, av);
  ops::add(h.ctx, h.s(), a2, b, a2);
  for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] + bv[i];
  check_close(read(h, a2), ref, tol, "in-place add " + dt_name(dt), 0.0);

  for (DType to : {DType::f32, DType::bf16, DType::f16}) {
    Tensor c = h.ctx.empty({n}, to);
    ops::cast(h.ctx, h.s(), a, c);
    for (size_t i = 0; i < av.size(); ++i) ref[i] = round_to(av[i], to);
    Vec got = read(h, c);
    CHECK(got == ref);  // rounding to nearest even is exact arithmetic
  }

  ops::fill(h.ctx, h.s(), out, 0.3);
  Vec got = read(h, out);
  for (double g : got) REQUIRE(g == round_to(0.3, dt));
}

TEST_CASE("fill works for integer dtypes", "[elementwise]") {
  Host h;
  Tensor t = h.ctx.empty({5, 3}, DType::i64);
  ops::fill(h.ctx, h.s(), t, -7);
  for (double v : read(h, t)) CHECK(v == -7);
  Tensor u = h.ctx.empty({4}, DType::i32);
  ops::fill(h.ctx, h.s(), u, 12);
  for (double v : read(h, u)) CHECK(v == 12);
}

TEST_CASE("bias_gelu forward and backward match references", "[elementwise][gelu]") {
  Host h;
  auto kind = GENERATE(ops::GeluKind::Tanh, ops::GeluKind::Erf);
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto shape = GENERATE(Shape{1, 1}, Shape{3, 17}, Shape{2, 5, 33}, Shape{129, 64}, Shape{700, 96});
  const int64_t n = shape[shape.ndim() - 1], rows = shape.numel() / n;
  Tensor x = rand_tensor(h, shape, dt, 3, -4, 4);
  Tensor bias = rand_tensor(h, {n}, dt, 4);
  Tensor dy = rand_tensor(h, shape, dt, 5);
  Vec xv = read(h, x), bv = read(h, bias), dyv = read(h, dy);
  Tensor y = h.ctx.empty(shape, dt), dx = h.ctx.empty(shape, dt), db = h.ctx.empty({n}, dt);
  ops::bias_gelu_fwd(h.ctx, h.s(), x, &bias, y, kind);
  ops::bias_gelu_bwd(h.ctx, h.s(), dy, x, &bias, dx, &db, kind);
  Vec yref(xv.size()), dxref(xv.size()), dbref(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      size_t i = static_cast<size_t>(r * n + j);
      double u = xv[i] + bv[static_cast<size_t>(j)];
      yref[i] = gelu_ref(u, kind);
      dxref[i] = dyv[i] * gelu_grad_ref(u, kind);
    }
  }
  // The kernel's dbias sums its own (rounded) dx values; the reference sums exact ones.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      dbref[static_cast<size_t>(j)] += dxref[static_cast<size_t>(r * n + j)];
  std::string tag = std::string(ops::gelu_kind_name(kind)) + " " + dt_name(dt) + " " + shape.str();
  check_close(read(h, y), yref, tol_for(dt, 1e-5), "gelu fwd " + tag, 0.01);
  check_close(read(h, dx), dxref, tol_for(dt, 1e-5), "gelu bwd dx " + tag, 0.1);
  check_close(read(h, db), dbref, tol_for(dt, 1e-5), "gelu bwd dbias " + tag, 0.05);

  // accumulate adds to dbias; no bias is also fine.
  Vec db_old = read(h, db);
  ops::bias_gelu_bwd(h.ctx, h.s(), dy, x, &bias, dx, &db, kind, true);
  Vec db2 = read(h, db);
  for (size_t j = 0; j < db2.size(); ++j) dbref[j] = 2 * dbref[j];
  check_close(db2, dbref, 2 * tol_for(dt, 1e-5), "gelu bwd dbias accumulate " + tag, 0.05);
  ops::bias_gelu_fwd(h.ctx, h.s(), x, nullptr, y, kind);
  for (size_t i = 0; i < xv.size(); ++i) yref[i] = gelu_ref(xv[i], kind);
  check_close(read(h, y), yref, tol_for(dt, 1e-5), "gelu fwd without bias " + tag, 0.01);
}

TEST_CASE("bias_gelu backward matches finite differences of the forward",
          "[elementwise][gelu][fd]") {
  Host h;
  auto kind = GENERATE(ops::GeluKind::Tanh, ops::GeluKind::Erf);
  const Shape shape{3, 11};
  Vec xv = uniform(33, 7, -3, 3), bv = uniform(11, 8), w = uniform(33, 9);
  Tensor x = make(h, shape, DType::f32, xv), bias = make(h, {11}, DType::f32, bv);
  Tensor y = h.ctx.empty(shape, DType::f32), dy = make(h, shape, DType::f32, w);
  Tensor dx = h.ctx.empty(shape, DType::f32), db = h.ctx.empty({11}, DType::f32);
  ops::bias_gelu_bwd(h.ctx, h.s(), dy, x, &bias, dx, &db, kind);
  Vec dxv = read(h, dx), dbv = read(h, db);
  auto loss_x = [&](const Vec& xp) {
    write(h, x, xp);
    ops::bias_gelu_fwd(h.ctx, h.s(), x, &bias, y, kind);
    return dot(read(h, y), w);
  };
  check_grad_fd(loss_x, xv, dxv, "gelu dx");
  write(h, x, xv);
  auto loss_b = [&](const Vec& bp) {
    write(h, bias, bp);
    ops::bias_gelu_fwd(h.ctx, h.s(), x, &bias, y, kind);
    return dot(read(h, y), w);
  };
  check_grad_fd(loss_b, bv, dbv, "gelu dbias");
}

TEST_CASE("dropout: reproducible Philox mask, inverted scaling, shard = slice",
          "[elementwise][dropout]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16);
  auto p = GENERATE(0.0f, 0.1f, 0.5f);
  const int64_t n = 40003;
  Tensor x = rand_tensor(h, {n}, dt, 11, 0.5, 1.5);  // nonzero, so zeros mark drops
  Vec xv = read(h, x);
  Tensor y = h.ctx.empty({n}, dt), y2 = h.ctx.empty({n}, dt);
  ops::dropout_fwd(h.ctx, h.s(), x, y, p, 1234, 7);
  ops::dropout_fwd(h.ctx, h.s(), x, y2, p, 1234, 7);
  Vec yv = read(h, y);
  CHECK(yv == read(h, y2));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    size_t k = static_cast<size_t>(i);
    if (yv[k] != 0) {
      ++kept;
      REQUIRE(std::abs(yv[k] - xv[k] / (1.0 - p)) <= tol_for(dt, 1e-6) * std::abs(yv[k]));
    }
  }
  double frac = static_cast<double>(kept) / static_cast<double>(n);
  // Binomial: 5 standard deviations.
  CHECK(std::abs(frac - (1.0 - p)) <= 5 * std::sqrt(p * (1 - p) / static_cast<double>(n)) + 1e-12);

  // Another offset gives another mask (when something is dropped at all).
  ops::dropout_fwd(h.ctx, h.s(), x, y2, p, 1234, 8);
  if (p > 0) CHECK(yv != read(h, y2));

  // The second half of the tensor, dropped on its own with index_base, equals the slice.
  const int64_t half = 20001;
  Tensor xs = x.narrow(0, half, n - half);
  Tensor ys = h.ctx.empty({n - half}, dt);
  ops::dropout_fwd(h.ctx, h.s(), xs, ys, p, 1234, 7, half);
  Vec ysv = read(h, ys);
  CHECK(ysv == Vec(yv.begin() + half, yv.end()));

  // Backward uses the same mask.
  Tensor g = h.ctx.empty({n}, dt);
  ops::fill(h.ctx, h.s(), g, 1.0);
  Tensor dx = h.ctx.empty({n}, dt);
  ops::dropout_bwd(h.ctx, h.s(), g, dx, p, 1234, 7);
  Vec dxv = read(h, dx);
  for (int64_t i = 0; i < n; ++i) {
    size_t k = static_cast<size_t>(i);
    REQUIRE((dxv[k] != 0) == (yv[k] != 0));
    if (dxv[k] != 0) REQUIRE(std::abs(dxv[k] - 1.0 / (1.0 - p)) <= tol_for(dt, 1e-6));
  }
}

TEST_CASE("sum_squares accumulates the sum of squares and propagates NaN", "[elementwise]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  // Sizes around the host chunk (32768 elements) and a multi-chunk one.
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{32768}, int64_t{32769}, int64_t{200003}}) {
    INFO(dt_name(dt) << " n " << n);
    Tensor x = rand_tensor(h, {n}, dt, 7);
    double ref = 0.5;  // out starts at 0.5: the op adds to it
    for (double v : read(h, x)) ref += v * v;
    Tensor out = make(h, {1}, DType::f32, Vec{0.5});
    ops::sum_squares(h.ctx, h.s(), x, out);
    // f32 lanes of up to 2048 positive terms per chunk: typically sqrt(2048) * 2^-24 ~ 3e-6.
    CHECK(read(h, out)[0] == Approx(ref).epsilon(3e-5));
    // One NaN (or infinity) anywhere makes the sum non-finite.
    Vec xv = read(h, x);
    xv[static_cast<size_t>(n / 2)] = std::nan("");
    Tensor bad = make(h, {n}, dt, xv);
    ops::sum_squares(h.ctx, h.s(), bad, out);
    CHECK(std::isnan(read(h, out)[0]));
  }
  Tensor x = rand_tensor(h, {8}, dt, 1);
  Tensor two = make(h, {2}, DType::f32, Vec{0, 0});
  CHECK_THROWS_WITH(ops::sum_squares(h.ctx, h.s(), x, two), Catch::Contains("one element"));
  Tensor wrong = make(h, {1}, DType::bf16, Vec{0});
  CHECK_THROWS_WITH(ops::sum_squares(h.ctx, h.s(), x, wrong), Catch::Contains("out"));
}

// The host dropout draws 16 Philox counters at a time (vectorized rounds) between a scalar head
// and tail: every element must equal the scalar reference (kmath::dropout_keep), bit for bit,
// whatever the size and the index base (block boundaries fall anywhere), NaN / Inf included.
TEST_CASE("dropout equals the scalar Philox reference on odd sizes, bases, NaN / Inf",
          "[elementwise][dropout]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto n = GENERATE(int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003});
  auto base = GENERATE(int64_t{0}, int64_t{3}, int64_t{65});
  const float p = 0.3f;
  const uint64_t seed = 0x123456789abcdefull, offset = 0x100000005ull;
  Vec xv = uniform(n, 5, -2.0, 2.0, dt);
  const double specials[] = {std::nan(""), INFINITY, -INFINITY, -0.0};
  for (int64_t i = 0; i < n; i += 97) xv[static_cast<size_t>(i)] = specials[(i / 97) % 4];
  Tensor x = make(h, {n}, dt, xv), y = h.ctx.empty({n}, dt);
  ops::dropout_fwd(h.ctx, h.s(), x, y, p, seed, offset, base);
  Vec yv = read(h, y);
  const float inv = 1.0f / (1.0f - p);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const bool keep = meshrt::kmath::dropout_keep(seed, offset, static_cast<uint64_t>(base + i), p);
    const double want = keep ? round_to(static_cast<float>(xv[k]) * inv, dt) : 0.0;
    const bool same = std::isnan(want) ? std::isnan(yv[k]) : yv[k] == want;
    if (!same && bad++ < 5) {
      INFO("i " << i << " x " << xv[k] << " got " << yv[k] << " want " << want);
      CHECK(same);
    }
  }
  CHECK(bad == 0);
}
