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

// ---- document masking (packed sequences) --------------------------------------------------------

namespace {

// Document ids [batch, seq] from each row's document lengths.
Vec doc_ids(const std::vector<std::vector<int64_t>>& lengths) {
  Vec ids;
  for (const auto& row : lengths)
    for (size_t d = 0; d < row.size(); ++d)
      for (int64_t i = 0; i < row[d]; ++i) ids.push_back(static_cast<double>(d));
  return ids;
}

struct Naive {
  Vec out, lse, dq, dk, dv;
};

// Doc-masked attention in double, the textbook way: full softmax over the visible keys (same
// document and, causal, not after the query), and its backward.
Naive naive_doc_attention(const Vec& q, const Vec& k, const Vec& v, const Vec& dout, const Vec& doc,
                          const Blocked& g, double scale, bool causal) {
  const int64_t S = g.s, D = g.d;
  Naive r{Vec(q.size(), 0.0), Vec(static_cast<size_t>(g.b * g.h * S)), Vec(q.size(), 0.0),
          Vec(q.size(), 0.0), Vec(q.size(), 0.0)};
  auto at = [&](int64_t bh, int64_t i) { return static_cast<size_t>((bh * S + i) * D); };
  for (int64_t bh = 0; bh < g.b * g.h; ++bh) {
    const double* dr = doc.data() + (bh / g.h) * S;
    for (int64_t i = 0; i < S; ++i) {
      Vec p(static_cast<size_t>(S), 0.0);
      double m = -std::numeric_limits<double>::infinity(), l = 0;
      auto sees = [&](int64_t j) { return dr[j] == dr[i] && (!causal || j <= i); };
      for (int64_t j = 0; j < S; ++j) {
        if (!sees(j)) continue;
        double s = 0;
        for (int64_t c = 0; c < D; ++c) s += q[at(bh, i) + c] * k[at(bh, j) + c];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      for (int64_t j = 0; j < S; ++j) l += sees(j) ? std::exp(p[j] - m) : 0.0;
      for (int64_t j = 0; j < S; ++j) p[j] = sees(j) ? std::exp(p[j] - m) / l : 0.0;
      r.lse[static_cast<size_t>(bh * S + i)] = m + std::log(l);
      Vec dp(static_cast<size_t>(S), 0.0);
      double di = 0;
      for (int64_t j = 0; j < S; ++j) {
        for (int64_t c = 0; c < D; ++c) {
          r.out[at(bh, i) + c] += p[j] * v[at(bh, j) + c];
          dp[j] += dout[at(bh, i) + c] * v[at(bh, j) + c];
        }
        di += p[j] * dp[j];
      }
      for (int64_t j = 0; j < S; ++j) {
        const double ds = p[j] * (dp[j] - di) * scale;
        for (int64_t c = 0; c < D; ++c) {
          r.dq[at(bh, i) + c] += ds * k[at(bh, j) + c];
          r.dk[at(bh, j) + c] += ds * q[at(bh, i) + c];
          r.dv[at(bh, j) + c] += p[j] * dout[at(bh, i) + c];
        }
      }
    }
  }
  return r;
}

// Rows [r0, r1) of a [batch, seq] id tensor's values.
Vec doc_rows(const Vec& doc, const Blocked& g, int64_t r0, int64_t r1) {
  Vec out;
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t r = r0; r < r1; ++r) out.push_back(doc[static_cast<size_t>(b * g.s + r)]);
  return out;
}

}  // namespace

TEST_CASE("doc-masked attention blocks merged equal naive masked attention",
          "[attention][block][docmask]") {
  Host h;
  auto causal = GENERATE(true, false);
  // Documents of odd lengths, boundaries inside the query and key blocks, one 1-token document;
  // query block [100, 149) and key block [0, 70) share no document in either row (an empty
  // partial), and key block [70, 71) is one token.
  const Blocked g{2, 2, 149, 5};
  const Vec doc = doc_ids({{1, 36, 3, 60, 49}, {70, 1, 78}});
  const std::vector<int64_t> qcut{0, 37, 100, 149}, kcut{0, 70, 71, 149};
  const float scale = 0.45f;
  const DType dt = DType::f32;
  const Shape full{g.b, g.h, g.s, g.d};
  const Vec qv = uniform(g.b * g.h * g.s * g.d, 1, -2, 2), kv = uniform(qv.size(), 2, -2, 2);
  const Vec vv = uniform(qv.size(), 3), gv = uniform(qv.size(), 4);
  const Naive ref = naive_doc_attention(qv, kv, vv, gv, doc, g, scale, causal);

  Vec mout(qv.size()), mlse(ref.lse.size()), bdq(qv.size(), 0.0), bdk(qv.size(), 0.0),
      bdv(qv.size(), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t qi = 0; qi + 1 < qcut.size(); ++qi) {
    const int64_t q0 = qcut[qi], q1 = qcut[qi + 1], n = q1 - q0;
    const Shape qs{g.b, g.h, n, g.d}, ls{g.b, g.h, n};
    Tensor qb = make(h, qs, dt, rows_of(qv, g, g.d, q0, q1));
    Tensor qd = make(h, {g.b, n}, DType::i32, doc_rows(doc, g, q0, q1));
    Tensor acc = h.ctx.empty(qs, dt), acc_lse = h.ctx.empty(ls, DType::f32);
    ops::fill(h.ctx, h.s(), acc, 0.0);
    ops::fill(h.ctx, h.s(), acc_lse, -inf);
    // The backward takes the naive forward's out and lse (the merged ones, checked below).
    Tensor ob = make(h, qs, dt, rows_of(ref.out, g, g.d, q0, q1));
    Tensor gb = make(h, qs, dt, rows_of(gv, g, g.d, q0, q1));
    Tensor lb = make(h, ls, DType::f32, rows_of(ref.lse, g, 1, q0, q1));
    for (size_t ki = 0; ki + 1 < kcut.size(); ++ki) {
      const int64_t k0 = kcut[ki], k1 = kcut[ki + 1], m = k1 - k0;
      const Shape ks{g.b, g.h, m, g.d};
      Tensor kb = make(h, ks, dt, rows_of(kv, g, g.d, k0, k1));
      Tensor vb = make(h, ks, dt, rows_of(vv, g, g.d, k0, k1));
      Tensor kd = make(h, {g.b, m}, DType::i32, doc_rows(doc, g, k0, k1));
      Tensor po = h.ctx.empty(qs, dt), pl = h.ctx.empty(ls, DType::f32);
      ops::attention_block_fwd(h.ctx, h.s(), qb, kb, vb, po, pl, scale, causal, q0, k0, qd, kd);
      if (q0 == 100 && k0 == 0) {  // no shared document: the neutral partial
        for (double x : read(h, pl)) REQUIRE(x == -inf);
        for (double x : read(h, po)) REQUIRE(x == 0.0);
      }
      ops::attention_merge(h.ctx, h.s(), acc, acc_lse, po, pl);
      Tensor pdq = h.ctx.empty(qs, dt), pdk = h.ctx.empty(ks, dt), pdv = h.ctx.empty(ks, dt);
      ops::attention_block_bwd(h.ctx, h.s(), qb, kb, vb, ob, gb, lb, pdq, pdk, pdv, scale, causal,
                               q0, k0, qd, kd);
      add_rows(bdq, g, g.d, q0, q1, read(h, pdq));
      add_rows(bdk, g, g.d, k0, k1, read(h, pdk));
      add_rows(bdv, g, g.d, k0, k1, read(h, pdv));
    }
    add_rows(mout, g, g.d, q0, q1, read(h, acc));
    add_rows(mlse, g, 1, q0, q1, read(h, acc_lse));
  }
  const std::string tag = causal ? "causal" : "full";
  check_close(mout, ref.out, 2e-5, "doc-masked out " + tag);
  check_close(mlse, ref.lse, 1e-5, "doc-masked lse " + tag);
  check_close(bdq, ref.dq, 2e-5, "doc-masked dq " + tag);
  check_close(bdk, ref.dk, 2e-5, "doc-masked dk " + tag);
  check_close(bdv, ref.dv, 2e-5, "doc-masked dv " + tag);

  // One block over the whole sequence (offsets 0): doc-masked attention_fwd, bf16 too (inputs
  // and the output rounded to bf16).
  for (DType d2 : {DType::f32, DType::bf16}) {
    const int64_t n = g.b * g.h * g.s * g.d;
    const Vec q2 = uniform(n, 5, -2, 2, d2), k2 = uniform(n, 6, -2, 2, d2),
              v2 = uniform(n, 7, -1, 1, d2);
    const Naive r2 = naive_doc_attention(q2, k2, v2, v2, doc, g, scale, causal);
    Tensor q = make(h, full, d2, q2), k = make(h, full, d2, k2), v = make(h, full, d2, v2);
    Tensor ids = make(h, {g.b, g.s}, DType::i32, doc);
    Tensor out = h.ctx.empty(full, d2), lse = h.ctx.empty({g.b, g.h, g.s}, DType::f32);
    ops::attention_block_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, causal, 0, 0, ids, ids);
    check_close(read(h, out), r2.out, tol_for(d2), "whole out " + dt_name(d2));
    check_close(read(h, lse), r2.lse, 1e-5, "whole lse " + dt_name(d2));
  }
}

TEST_CASE("a doc-masked row that sees no key gives out 0, lse -inf and zero gradients",
          "[attention][block][docmask]") {
  Host h;
  const double inf = std::numeric_limits<double>::infinity();
  const Shape s{1, 1, 3, 2};
  // Query rows in documents 0, 0, 7 and keys in 0, 0, 1 (no mask but the documents'): rows 0 and
  // 1 see keys 0 and 1, row 2 sees nothing in a tile where the others see keys, and no query
  // sees key 2.
  Tensor q = make(h, s, DType::f32, {1, 2, 3, 4, 5, 6});
  Tensor kv = make(h, s, DType::f32, {1, 1, 2, 2, 3, 3});
  Tensor qd = make(h, {1, 3}, DType::i32, {0, 0, 7}), kd = make(h, {1, 3}, DType::i32, {0, 0, 1});
  Tensor out = h.ctx.empty(s, DType::f32), lse = h.ctx.empty({1, 1, 3}, DType::f32);
  ops::attention_block_fwd(h.ctx, h.s(), q, kv, kv, out, lse, 1.f, false, 0, 0, qd, kd);
  const Vec o = read(h, out), l = read(h, lse);
  REQUIRE(l[2] == -inf);
  REQUIRE((o[4] == 0.0 && o[5] == 0.0));
  for (size_t i = 0; i < 4; ++i) REQUIRE(std::isfinite(o[i]));
  REQUIRE((std::isfinite(l[0]) && std::isfinite(l[1])));
  // The backward with that lse (-inf in row 2): finite, and zero for row 2 and key 2.
  Tensor dq = h.ctx.empty(s, DType::f32), dk = h.ctx.empty(s, DType::f32);
  Tensor dv = h.ctx.empty(s, DType::f32), dout = make(h, s, DType::f32, {1, -1, 2, 0.5, 3, 1});
  ops::attention_block_bwd(h.ctx, h.s(), q, kv, kv, out, dout, lse, dq, dk, dv, 1.f, false, 0, 0,
                           qd, kd);
  const Vec gq = read(h, dq), gk = read(h, dk), gv = read(h, dv);
  for (const Vec* g : {&gq, &gk, &gv})
    for (double x : *g) REQUIRE(std::isfinite(x));
  REQUIRE((gq[4] == 0.0 && gq[5] == 0.0 && gk[4] == 0.0 && gk[5] == 0.0 && gv[4] == 0.0 &&
           gv[5] == 0.0));
  REQUIRE(gv[0] != 0.0);
}

TEST_CASE("doc-masked attention refuses bad document ids, naming them",
          "[attention][block][docmask]") {
  Host h;
  const Shape s{1, 1, 4, 3};
  Tensor q = rand_tensor(h, s, DType::f32, 1), out = h.ctx.empty(s, DType::f32);
  Tensor lse = h.ctx.empty({1, 1, 4}, DType::f32);
  Tensor good = make(h, {1, 4}, DType::i32, {0, 0, 1, 1});
  Tensor down = make(h, {1, 4}, DType::i32, {0, 2, 1, 1});
  Tensor shortd = make(h, {1, 3}, DType::i32, {0, 0, 1});
  Tensor wide = make(h, {1, 4}, DType::i64, {0, 0, 1, 1});
  auto fwd = [&](const Tensor& qd, const Tensor& kd) {
    ops::attention_block_fwd(h.ctx, h.s(), q, q, q, out, lse, 1.f, true, 0, 0, qd, kd);
    h.sync();
  };
  REQUIRE_THROWS_WITH(fwd(down, good),
                      Catch::Contains("op attention_block_fwd: q_doc[0, 2] = 1 follows q_doc[0, "
                                      "1] = 2: document ids must be non-decreasing"));
  REQUIRE_THROWS_WITH(fwd(good, down), Catch::Contains("k_doc[0, 2] = 1 follows k_doc[0, 1] = 2"));
  REQUIRE_THROWS_WITH(fwd(good, shortd),
                      Catch::Contains("k_doc i32[1, 3]") && Catch::Contains("must be i32 [1, 4]"));
  REQUIRE_THROWS_WITH(fwd(wide, good), Catch::Contains("q_doc i64[1, 4]"));
  REQUIRE_THROWS_WITH(fwd(good, Tensor()), Catch::Contains("q_doc and k_doc come together") &&
                                               Catch::Contains("no k_doc"));
  Tensor dq = h.ctx.empty(s, DType::f32);
  REQUIRE_THROWS_WITH((ops::attention_block_bwd(h.ctx, h.s(), q, q, q, q, q, lse, dq, dq, dq, 1.f,
                                                true, 0, 0, down, good),
                       h.sync()),
                      Catch::Contains("op attention_block_bwd: q_doc[0, 2] = 1 follows"));
  fwd(good, good);  // the stream is usable again
}
