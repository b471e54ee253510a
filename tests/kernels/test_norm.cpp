// LayerNorm and RMSNorm: forward / backward against double references and finite differences.
#include <cmath>

#include "helpers.h"

using namespace kt;
namespace ops = meshrt::ops;

namespace {

struct NormRef {
  Vec y, mean, rstd, dx, dg, db;
};

NormRef norm_ref(const Vec& x, const Vec& g, const Vec& b, const Vec& dy, int64_t rows, int64_t n,
                 double eps, bool rms) {
  NormRef r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dg.assign(static_cast<size_t>(n), 0.0);
  r.db.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = x.data() + i * n;
    double mu = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; ++j) mu += xr[j];
      mu /= static_cast<double>(n);
    }
    for (int64_t j = 0; j < n; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= static_cast<double>(n);
    double rs = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
    Vec xhat(static_cast<size_t>(n)), dyg(static_cast<size_t>(n));
    double m1 = 0, m2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      size_t k = static_cast<size_t>(i * n + j), jj = static_cast<size_t>(j);
      xhat[jj] = (xr[j] - mu) * rs;
      r.y[k] = xhat[jj] * g[jj] + (b.empty() ? 0.0 : b[jj]);
      dyg[jj] = dy[k] * g[jj];
      m1 += dyg[jj];
      m2 += dyg[jj] * xhat[jj];
      r.dg[jj] += dy[k] * xhat[jj];
      r.db[jj] += dy[k];
    }
    m1 /= static_cast<double>(n);
    m2 /= static_cast<double>(n);
    if (rms) m1 = 0;
    for (int64_t j = 0; j < n; ++j) {
      size_t jj = static_cast<size_t>(j);
      r.dx[static_cast<size_t>(i * n + j)] = rs * (dyg[jj] - m1 - xhat[jj] * m2);
    }
  }
  return r;
}

}  // namespace

TEST_CASE("layernorm and rmsnorm forward and backward match double references", "[norm]") {
  Host h;
  auto rms = GENERATE(false, true);
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto shape = GENERATE(Shape{1, 1}, Shape{3, 17}, Shape{2, 5, 33}, Shape{64, 256}, Shape{7, 1000});
  const int64_t n = shape[shape.ndim() - 1], rows = shape.numel() / n;
  const float eps = 1e-5f;
  Tensor x = rand_tensor(h, shape, dt, 1, -2, 3);
  Tensor g = rand_tensor(h, {n}, dt, 2, 0.5, 1.5);
  Tensor b = rand_tensor(h, {n}, dt, 3);
  Tensor dy = rand_tensor(h, shape, dt, 4);
  Vec xv = read(h, x), gv = read(h, g), bv = read(h, b), dyv = read(h, dy);
  Tensor y = h.ctx.empty(shape, dt), dx = h.ctx.empty(shape, dt);
  Tensor mean = h.ctx.empty({rows}, DType::f32), rstd = h.ctx.empty({rows}, DType::f32);
  Tensor dg = h.ctx.empty({n}, dt), db = h.ctx.empty({n}, dt);
  if (rms) {
    ops::rmsnorm_fwd(h.ctx, h.s(), x, g, y, rstd, eps);
    ops::rmsnorm_bwd(h.ctx, h.s(), dy, x, g, rstd, dx, &dg);
  } else {
    ops::layernorm_fwd(h.ctx, h.s(), x, g, &b, y, mean, rstd, eps);
    ops::layernorm_bwd(h.ctx, h.s(), dy, x, g, mean, rstd, dx, &dg, &db);
  }
  NormRef r = norm_ref(xv, gv, rms ? Vec{} : bv, dyv, rows, n, eps, rms);
  std::string tag = std::string(rms ? "rmsnorm " : "layernorm ") + dt_name(dt) + " " + shape.str();
  const double tol = tol_for(dt, 2e-5);
  check_close(read(h, y), r.y, tol, tag + " y");
  check_close(read(h, rstd), r.rstd, 2e-5, tag + " rstd");
  if (!rms) check_close(read(h, mean), r.mean, 2e-5, tag + " mean", 1.0);
  // n == 1: dx is 0 up to rounding of (dyg - mean(dyg)); compare against the row scale.
  check_close(read(h, dx), r.dx, tol, tag + " dx", n == 1 ? 1e6 : 0.1);
  check_close(read(h, dg), r.dg, tol, tag + " dgamma");
  if (!rms) check_close(read(h, db), r.db, tol, tag + " dbeta");

  // accumulate doubles the parameter gradients.
  if (rms) {
    ops::rmsnorm_bwd(h.ctx, h.s(), dy, x, g, rstd, dx, &dg, true);
  } else {
    ops::layernorm_bwd(h.ctx, h.s(), dy, x, g, mean, rstd, dx, &dg, &db, true);
  }
  for (auto& v : r.dg) v *= 2;
  for (auto& v : r.db) v *= 2;
  check_close(read(h, dg), r.dg, 2 * tol, tag + " dgamma accumulated");
  if (!rms) check_close(read(h, db), r.db, 2 * tol, tag + " dbeta accumulated");
}

TEST_CASE("layernorm and rmsnorm backward match finite differences", "[norm][fd]") {
  Host h;
  auto rms = GENERATE(false, true);
  const int64_t rows = 3, n = 13;
  const Shape shape{rows, n};
  Vec xv = uniform(rows * n, 21, -2, 2), gv = uniform(n, 22, 0.5, 1.5), bv = uniform(n, 23);
  Vec w = uniform(rows * n, 24);
  Tensor x = make(h, shape, DType::f32, xv), g = make(h, {n}, DType::f32, gv);
  Tensor b = make(h, {n}, DType::f32, bv), dy = make(h, shape, DType::f32, w);
  Tensor y = h.ctx.empty(shape, DType::f32), dx = h.ctx.empty(shape, DType::f32);
  Tensor mean = h.ctx.empty({rows}, DType::f32), rstd = h.ctx.empty({rows}, DType::f32);
  Tensor dg = h.ctx.empty({n}, DType::f32), db = h.ctx.empty({n}, DType::f32);
  auto fwd = [&] {
    if (rms) {
      ops::rmsnorm_fwd(h.ctx, h.s(), x, g, y, rstd);
    } else {
      ops::layernorm_fwd(h.ctx, h.s(), x, g, &b, y, mean, rstd);
    }
    return dot(read(h, y), w);
  };
  fwd();
  if (rms) {
    ops::rmsnorm_bwd(h.ctx, h.s(), dy, x, g, rstd, dx, &dg);
  } else {
    ops::layernorm_bwd(h.ctx, h.s(), dy, x, g, mean, rstd, dx, &dg, &db);
  }
  Vec dxv = read(h, dx), dgv = read(h, dg), dbv = read(h, db);
  std::string tag = rms ? "rmsnorm" : "layernorm";
  check_grad_fd(
      [&](const Vec& v) {
        write(h, x, v);
        return fwd();
      },
      xv, dxv, tag + " dx");
  write(h, x, xv);
  check_grad_fd(
      [&](const Vec& v) {
        write(h, g, v);
        return fwd();
      },
      gv, dgv, tag + " dgamma");
  write(h, g, gv);
  if (!rms) {
    check_grad_fd(
        [&](const Vec& v) {
          write(h, b, v);
          return fwd();
        },
        bv, dbv, tag + " dbeta");
  }
}
