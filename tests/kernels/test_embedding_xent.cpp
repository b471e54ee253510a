// Vocab-parallel embedding and cross-entropy pieces, composed over two shards as the mesh does.
#include <cmath>

#include "helpers.h"

using namespace kt;
namespace ops = meshrt::ops;

TEST_CASE("embedding forward / backward over a vocab shard", "[embedding]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16);
  auto it = GENERATE(DType::i32, DType::i64);
  auto d = GENERATE(int64_t{1}, int64_t{7}, int64_t{64});
  const int64_t vfull = 50, off = 20, vloc = 15;
  Vec ids = uniform(15, 3, 0, vfull);
  for (auto& x : ids) x = std::floor(x);
  ids[1] = ids[4] = ids[9] = 25;  // repeated ids inside the shard accumulate
  Tensor idt = make(h, {3, 5}, it, ids);
  Tensor w = rand_tensor(h, {vloc, d}, dt, 4);
  Tensor out = h.ctx.empty({3, 5, d}, dt);
  ops::embedding_fwd(h.ctx, h.s(), idt, w, out, off);
  Vec wv = read(h, w), ov = read(h, out);
  Vec ref(ov.size(), 0.0);
  for (int64_t t = 0; t < 15; ++t) {
    int64_t row = static_cast<int64_t>(ids[t]) - off;
    if (row >= 0 && row < vloc)
      for (int64_t j = 0; j < d; ++j) ref[t * d + j] = wv[row * d + j];
  }
  CHECK(ov == ref);

  Tensor dout = rand_tensor(h, {3, 5, d}, dt, 5);
  Tensor dw = h.ctx.empty({vloc, d}, dt);
  ops::fill(h.ctx, h.s(), dw, 99.0);  // overwritten, not accumulated
  ops::embedding_bwd(h.ctx, h.s(), idt, dout, dw, off);
  Vec gv = read(h, dout), dref(static_cast<size_t>(vloc * d), 0.0);
  for (int64_t t = 0; t < 15; ++t) {
    int64_t row = static_cast<int64_t>(ids[t]) - off;
    if (row >= 0 && row < vloc)
      for (int64_t j = 0; j < d; ++j) dref[row * d + j] += gv[t * d + j];
  }
  check_close(read(h, dw), dref, tol_for(dt, 1e-6), "embedding bwd " + dt_name(dt));
  ops::embedding_bwd(h.ctx, h.s(), idt, dout, dw, off, true);
  for (auto& x : dref) x *= 2;
  check_close(read(h, dw), dref, tol_for(dt, 1e-6), "embedding bwd accumulate " + dt_name(dt));
}

TEST_CASE("embedding backward matches finite differences", "[embedding][fd]") {
  Host h;
  Tensor idt = make(h, {6}, DType::i64, {0, 3, 3, 1, 4, 0});
  Vec wv = uniform(5 * 3, 7), gw = uniform(6 * 3, 8);
  Tensor w = make(h, {5, 3}, DType::f32, wv), out = h.ctx.empty({6, 3}, DType::f32);
  Tensor dout = make(h, {6, 3}, DType::f32, gw), dw = h.ctx.empty({5, 3}, DType::f32);
  ops::embedding_bwd(h.ctx, h.s(), idt, dout, dw);
  auto loss = [&](const Vec& x) {
    write(h, w, x);
    ops::embedding_fwd(h.ctx, h.s(), idt, w, out);
    return dot(read(h, out), gw);
  };
  check_grad_fd(loss, wv, read(h, dw), "embedding dweight");
}

namespace {

// Runs the vocab-parallel cross-entropy over shards [0, cut) and [cut, v) of logits [rows, v]
// (each shard its own tensor), combining the pieces as the mesh layer's all-reduces would.
// Returns per-row loss and the full gradient (concatenated shards).
void sharded_xent(Host& h, const Vec& logits, const Vec& targets, int64_t rows, int64_t v,
                  int64_t cut, DType dt, float grad_scale, Vec* loss, Vec* grad) {
  const int64_t widths[2] = {cut, v - cut};
  const int64_t offs[2] = {0, cut};
  Tensor tg = make(h, {rows}, DType::i64, targets);
  Tensor sh[2], mx[2], se[2], tl[2];
  for (int s = 0; s < 2; ++s) {
    Vec part;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < widths[s]; ++j) part.push_back(logits[r * v + offs[s] + j]);
    sh[s] = make(h, {rows, widths[s]}, dt, part);
    mx[s] = h.ctx.empty({rows}, DType::f32);
    se[s] = h.ctx.empty({rows}, DType::f32);
    tl[s] = h.ctx.empty({rows}, DType::f32);
    ops::xent_row_max(h.ctx, h.s(), sh[s], mx[s]);
  }
  // all-reduce(max)
  Vec m0 = read(h, mx[0]), m1 = read(h, mx[1]), gmax(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) gmax[r] = std::max(m0[r], m1[r]);
  Tensor gm = make(h, {rows}, DType::f32, gmax);
  for (int s = 0; s < 2; ++s) {
    ops::xent_row_sumexp(h.ctx, h.s(), sh[s], gm, se[s]);
    ops::xent_target_logit(h.ctx, h.s(), sh[s], tg, tl[s], offs[s]);
  }
  // all-reduce(sum)
  Vec s0 = read(h, se[0]), s1 = read(h, se[1]), t0 = read(h, tl[0]), t1 = read(h, tl[1]);
  Vec gsum(static_cast<size_t>(rows)), gtl(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    gsum[r] = s0[r] + s1[r];
    gtl[r] = t0[r] + t1[r];
  }
  Tensor gs = make(h, {rows}, DType::f32, gsum), gt = make(h, {rows}, DType::f32, gtl);
  Tensor lt = h.ctx.empty({rows}, DType::f32);
  ops::xent_loss(h.ctx, h.s(), gm, gs, gt, tg, lt);
  *loss = read(h, lt);
  grad->assign(static_cast<size_t>(rows * v), 0.0);
  for (int s = 0; s < 2; ++s) {
    Tensor dl = h.ctx.empty({rows, widths[s]}, dt);
    ops::xent_grad(h.ctx, h.s(), sh[s], gm, gs, tg, dl, offs[s], grad_scale);
    Vec dv = read(h, dl);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < widths[s]; ++j) (*grad)[r * v + offs[s] + j] = dv[r * widths[s] + j];
  }
}

}  // namespace

TEST_CASE("vocab-parallel cross-entropy over two shards equals the full softmax", "[xent]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16);
  auto v = GENERATE(int64_t{2}, int64_t{37}, int64_t{1000});
  const int64_t rows = 6, cut = std::min(v - 1, v / 2 + 1);
  Vec logits = uniform(rows * v, 9, -6, 6, dt);
  Vec targets = {0,
                 static_cast<double>(v - 1),
                 -100,
                 static_cast<double>(cut - 1),
                 static_cast<double>(cut),
                 static_cast<double>(v / 3)};
  const float gs = 1.0f / 5;  // mean over the 5 non-ignored rows
  Vec loss, grad;
  sharded_xent(h, logits, targets, rows, v, cut, dt, gs, &loss, &grad);
  Vec lref(static_cast<size_t>(rows), 0.0), gref(static_cast<size_t>(rows * v), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == -100) continue;
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, logits[r * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(logits[r * v + j] - m);
    int64_t t = static_cast<int64_t>(targets[r]);
    lref[r] = std::log(s) + m - logits[r * v + t];
    for (int64_t j = 0; j < v; ++j)
      gref[r * v + j] = gs * (std::exp(logits[r * v + j] - m) / s - (j == t ? 1.0 : 0.0));
  }
  std::string tag = dt_name(dt) + " v=" + std::to_string(v);
  check_close(loss, lref, 1e-5, "xent loss " + tag);
  check_close(grad, gref, tol_for(dt, 1e-5), "xent grad " + tag, 0.05);
}

TEST_CASE("cross-entropy gradient matches finite differences of the loss", "[xent][fd]") {
  Host h;
  const int64_t rows = 3, v = 11;
  Vec logits = uniform(rows * v, 12, -3, 3), targets = {2, 10, 5};
  Vec loss, grad;
  sharded_xent(h, logits, targets, rows, v, 4, DType::f32, 1.0f, &loss, &grad);
  auto total = [&](const Vec& x) {
    Vec l, g;
    sharded_xent(h, x, targets, rows, v, 4, DType::f32, 1.0f, &l, &g);
    double s = 0;
    for (double e : l) s += e;
    return s;
  };
  check_grad_fd(total, logits, grad, "xent dlogits");
}
