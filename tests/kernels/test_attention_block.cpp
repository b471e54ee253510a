// Attention over blocks at position offsets (context parallelism's kernels): every block's partial
// merged by log-sum-exp equals attention over the whole sequence, forward and backward.
#include <cmath>
#include <limits>

#include "helpers.h"

using namespace kt;
namespace ops = meshrt::ops;

namespace {

struct Blocked {
  int64_t b, h, s, d;
};

// Rows [r0, r1) of the seq dim of a [b, h, s, d] tensor's values (d = 1 for an lse).
Vec rows_of(const Vec& x, const Blocked& g, int64_t d, int64_t r0, int64_t r1) {
  Vec out;
  for (int64_t bh = 0; bh < g.b * g.h; ++bh)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < d; ++j) out.push_back(x[static_cast<size_t>((bh * g.s + r) * d + j)]);
  return out;
}

// Adds a block's values back at rows [r0, r1).
void add_rows(Vec& x, const Blocked& g, int64_t d, int64_t r0, int64_t r1, const Vec& part) {
  size_t i = 0;
  for (int64_t bh = 0; bh < g.b * g.h; ++bh)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < d; ++j) x[static_cast<size_t>((bh * g.s + r) * d + j)] += part[i++];
}

}  // namespace

TEST_CASE("attention blocks at offsets merged equal attention over the sequence",
          "[attention][block]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16);
  auto causal = GENERATE(true, false);
  // Odd lengths and head_dim; query and key cuts differ (a 1-row block, blocks straddling the
  // diagonal, blocks wholly in the future of some query blocks).
  const Blocked g{1, 2, 149, 5};
  const std::vector<int64_t> qcut{0, 37, 100, 149}, kcut{0, 70, 71, 149};
  const float scale = 0.45f;
  const Shape full{g.b, g.h, g.s, g.d};
  Tensor q = rand_tensor(h, full, dt, 1, -2, 2), k = rand_tensor(h, full, dt, 2, -2, 2);
  Tensor v = rand_tensor(h, full, dt, 3), dout = rand_tensor(h, full, dt, 4);
  Tensor out = h.ctx.empty(full, dt), lse = h.ctx.empty({g.b, g.h, g.s}, DType::f32);
  Tensor dq = h.ctx.empty(full, dt), dk = h.ctx.empty(full, dt), dv = h.ctx.empty(full, dt);
  ops::attention_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, causal);
  ops::attention_bwd(h.ctx, h.s(), q, k, v, out, dout, lse, dq, dk, dv, scale, causal);
  const Vec qv = read(h, q), kv = read(h, k), vv = read(h, v), gv = read(h, dout);
  const Vec ov = read(h, out), lv = read(h, lse);

  Vec mout(ov.size()), mlse(lv.size()), bdq(ov.size(), 0.0), bdk(ov.size(), 0.0),
      bdv(ov.size(), 0.0);
  for (size_t qi = 0; qi + 1 < qcut.size(); ++qi) {
    const int64_t q0 = qcut[qi], q1 = qcut[qi + 1], n = q1 - q0;
    const Shape qs{g.b, g.h, n, g.d}, ls{g.b, g.h, n};
    Tensor qb = make(h, qs, dt, rows_of(qv, g, g.d, q0, q1));
    Tensor acc = h.ctx.empty(qs, dt), acc_lse = h.ctx.empty(ls, DType::f32);
    ops::fill(h.ctx, h.s(), acc, 0.0);
    ops::fill(h.ctx, h.s(), acc_lse, -std::numeric_limits<double>::infinity());
    // The backward takes the whole sequence's out and lse for this query block.
    Tensor ob = make(h, qs, dt, rows_of(ov, g, g.d, q0, q1));
    Tensor gb = make(h, qs, dt, rows_of(gv, g, g.d, q0, q1));
    Tensor lb = make(h, ls, DType::f32, rows_of(lv, g, 1, q0, q1));
    for (size_t ki = 0; ki + 1 < kcut.size(); ++ki) {
      const int64_t k0 = kcut[ki], k1 = kcut[ki + 1], m = k1 - k0;
      const Shape ks{g.b, g.h, m, g.d};
      Tensor kb = make(h, ks, dt, rows_of(kv, g, g.d, k0, k1));
      Tensor vb = make(h, ks, dt, rows_of(vv, g, g.d, k0, k1));
      Tensor po = h.ctx.empty(qs, dt), pl = h.ctx.empty(ls, DType::f32);
      ops::attention_block_fwd(h.ctx, h.s(), qb, kb, vb, po, pl, scale, causal, q0, k0);
      if (causal && k0 > q1 - 1) {  // wholly in the future: empty partial
        for (double x : read(h, pl)) REQUIRE(x == -std::numeric_limits<double>::infinity());
        for (double x : read(h, po)) REQUIRE(x == 0.0);
      }
      ops::attention_merge(h.ctx, h.s(), acc, acc_lse, po, pl);
      Tensor pdq = h.ctx.empty(qs, dt), pdk = h.ctx.empty(ks, dt), pdv = h.ctx.empty(ks, dt);
      ops::attention_block_bwd(h.ctx, h.s(), qb, kb, vb, ob, gb, lb, pdq, pdk, pdv, scale, causal,
                               q0, k0);
      add_rows(bdq, g, g.d, q0, q1, read(h, pdq));
      add_rows(bdk, g, g.d, k0, k1, read(h, pdk));
      add_rows(bdv, g, g.d, k0, k1, read(h, pdv));
    }
    add_rows(mout, g, g.d, q0, q1, read(h, acc));
    add_rows(mlse, g, 1, q0, q1, read(h, acc_lse));
  }
  const std::string tag = dt_name(dt) + (causal ? " causal" : " full");
  // f32: rounding only. bf16: each block's partial output and gradients are rounded to bf16
  // before they are merged or summed (a bf16 rounding, 2^-8, per block on top of the whole
  // sequence's), so elements near cancellation differ by a few of them.
  const double tol = dt == DType::f32 ? 2e-5 : 0.1;
  check_close(mout, ov, tol, "merged out " + tag);
  check_close(mlse, lv, 1e-5, "merged lse " + tag);
  check_close(bdq, read(h, dq), tol, "blocked dq " + tag);
  check_close(bdk, read(h, dk), tol, "blocked dk " + tag);
  check_close(bdv, read(h, dv), tol, "blocked dv " + tag);
}

TEST_CASE("attention_merge with an empty side is exact", "[attention][block]") {
  Host h;
  const double inf = std::numeric_limits<double>::infinity();
  const Shape os{1, 1, 3, 2}, ls{1, 1, 3};
  // Row 0: the partial is empty; row 1: the accumulator is empty; row 2: both are.
  Tensor out = make(h, os, DType::f32, {0.25, -1.5, 0, 0, 0, 0});
  Tensor lse = make(h, ls, DType::f32, {0.7, -inf, -inf});
  Tensor part = make(h, os, DType::f32, {0, 0, 3.125, 0.5, 0, 0});
  Tensor plse = make(h, ls, DType::f32, {-inf, -2.5, -inf});
  ops::attention_merge(h.ctx, h.s(), out, lse, part, plse);
  REQUIRE(read(h, out) == Vec{0.25, -1.5, 3.125, 0.5, 0, 0});
  REQUIRE(read(h, lse) == Vec{read(h, make(h, {1}, DType::f32, {0.7}))[0], -2.5, -inf});
}

TEST_CASE("attention block ops refuse bad offsets and lse shapes", "[attention][block]") {
  Host h;
  const Shape s{1, 1, 4, 3};
  Tensor q = h.ctx.empty(s, DType::f32), out = h.ctx.empty(s, DType::f32);
  Tensor lse = h.ctx.empty({1, 1, 4}, DType::f32), bad = h.ctx.empty({1, 1, 3}, DType::f32);
  REQUIRE_THROWS_WITH(ops::attention_block_fwd(h.ctx, h.s(), q, q, q, out, lse, 1.f, true, -1, 0),
                      Catch::Contains("q_offset=-1 and kv_offset=0 must be >= 0"));
  REQUIRE_THROWS_WITH(ops::attention_merge(h.ctx, h.s(), out, bad, out, bad),
                      Catch::Contains("must have one element per row"));
}
