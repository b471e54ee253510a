// Context parallelism's attention block ops on CUDA (attention_block_fwd / bwd at position offsets,
// with and without document masks, and attention_merge) against the host: each block's partial
// and gradients equal the host's, and the GPU's partials merged (and its gradients summed) equal
// the host's attention over the whole sequence. The cases skip with the reason when no GPU is
// usable (tests/common/cuda_skip.h).
#include <cmath>
#include <limits>

#include "attention_cases.h"
#include "tests/common/cuda_skip.h"

using namespace kt;
using namespace kt::attn;
namespace ops = meshrt::ops;

// Named (not anonymous): the unity build may put this file with test_attention_block.cpp, whose
// helpers have the same names.
namespace cuda_block {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Seq {
  int64_t b, h, s, d;
};

// Rows [r0, r1) of the seq dim of a [b, h, s, d] tensor's values (d = 1 for an lse).
Vec rows_of(const Vec& x, const Seq& g, int64_t d, int64_t r0, int64_t r1) {
  Vec out;
  for (int64_t bh = 0; bh < g.b * g.h; ++bh)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < d; ++j) out.push_back(x[static_cast<size_t>((bh * g.s + r) * d + j)]);
  return out;
}

// Adds a block's values back at rows [r0, r1).
void add_rows(Vec& x, const Seq& g, int64_t d, int64_t r0, int64_t r1, const Vec& part) {
  size_t i = 0;
  for (int64_t bh = 0; bh < g.b * g.h; ++bh)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < d; ++j) x[static_cast<size_t>((bh * g.s + r) * d + j)] += part[i++];
}

// Document ids [batch, seq] from each row's document lengths, and positions [r0, r1) of them.
Vec doc_ids(const std::vector<std::vector<int64_t>>& lengths) {
  Vec ids;
  for (const auto& row : lengths)
    for (size_t d = 0; d < row.size(); ++d)
      for (int64_t i = 0; i < row[d]; ++i) ids.push_back(static_cast<double>(d));
  return ids;
}
Vec doc_rows(const Vec& doc, const Seq& g, int64_t r0, int64_t r1) {
  Vec out;
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t r = r0; r < r1; ++r) out.push_back(doc[static_cast<size_t>(b * g.s + r)]);
  return out;
}

// A partial lse: -inf (a row that sees no key) exactly where the host has it, the rest close.
void check_lse(Vec got, Vec want, const Tol& tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " row " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE((got[i] == -kInf) == (want[i] == -kInf));
    if (want[i] == -kInf) got[i] = want[i] = 0;
  }
  check_close(got, want, tol.tol, what, tol.floor(1));
}

}  // namespace cuda_block

namespace cuda_block {

// The blocks of one sequence: the host's whole-sequence inputs and results (offsets 0; the
// doc-masked attention when docs), and sums of the GPU's blocks (partials merged, gradients
// added at their rows).
struct Blocks {
  Gpu& g;
  Seq sq;
  DType dt;
  bool causal, docs;
  float scale = 0.3f;
  Tol tol, lse_tol;
  Vec doc, qv, kv, vv, gv, ov, lv, dq, dk, dv;
  Vec mout, mlse, bdq, bdk, bdv;

  Blocks(Gpu& gpu, const Seq& s, DType t, bool c, bool d, const Vec& ids, bool flash)
      : g(gpu),
        sq(s),
        dt(t),
        causal(c),
        docs(d),
        tol(flash ? tol16(t) : reference_tol(t)),
        lse_tol(flash ? lse_tol16() : reference_lse_tol()),
        doc(ids) {
    Host& h = g.host;
    const Shape full{sq.b, sq.h, sq.s, sq.d};
    Tensor q = rand_tensor(h, full, dt, 11, -2, 2), k = rand_tensor(h, full, dt, 12, -2, 2);
    Tensor v = rand_tensor(h, full, dt, 13), dout = rand_tensor(h, full, dt, 14);
    Tensor out = h.ctx.empty(full, dt), lse = h.ctx.empty({sq.b, sq.h, sq.s}, DType::f32);
    Tensor tdq = h.ctx.empty(full, dt), tdk = h.ctx.empty(full, dt), tdv = h.ctx.empty(full, dt);
    Tensor dids = docs ? make(h, {sq.b, sq.s}, DType::i32, doc) : Tensor();
    ops::attention_block_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, causal, 0, 0, dids, dids);
    ops::attention_block_bwd(h.ctx, h.s(), q, k, v, out, dout, lse, tdq, tdk, tdv, scale, causal, 0,
                             0, dids, dids);
    qv = read(h, q), kv = read(h, k), vv = read(h, v), gv = read(h, dout);
    ov = read(h, out), lv = read(h, lse), dq = read(h, tdq), dk = read(h, tdk), dv = read(h, tdv);
    mout.assign(ov.size(), 0.0), mlse.assign(lv.size(), 0.0);
    bdq.assign(ov.size(), 0.0), bdk.assign(ov.size(), 0.0), bdv.assign(ov.size(), 0.0);
  }

  // Query block [q0, q1) against each key block of kcut, on the GPU and on the host: each
  // block's partial and gradients alike, the GPU's partials merged into mout / mlse.
  void run(int64_t q0, int64_t q1, const std::vector<int64_t>& kcut, const std::string& tag) {
    Host& h = g.host;
    const int64_t n = q1 - q0;
    const Shape qs{sq.b, sq.h, n, sq.d}, ls{sq.b, sq.h, n};
    Tensor qb = make(h, qs, dt, rows_of(qv, sq, sq.d, q0, q1));
    Tensor ob = make(h, qs, dt, rows_of(ov, sq, sq.d, q0, q1));
    Tensor gb = make(h, qs, dt, rows_of(gv, sq, sq.d, q0, q1));
    Tensor lb = make(h, ls, DType::f32, rows_of(lv, sq, 1, q0, q1));
    Tensor qd = docs ? make(h, {sq.b, n}, DType::i32, doc_rows(doc, sq, q0, q1)) : Tensor();
    Tensor dqb = g.up(qb), dob = g.up(ob), dgb = g.up(gb), dlb = g.up(lb);
    Tensor dqd = docs ? g.up(qd) : Tensor();
    Tensor acc = g.ctx.empty(qs, dt), acc_lse = g.ctx.empty(ls, DType::f32);
    ops::fill(g.ctx, g.s(), acc, 0.0);
    ops::fill(g.ctx, g.s(), acc_lse, -kInf);
    for (size_t ki = 0; ki + 1 < kcut.size(); ++ki) {
      const int64_t k0 = kcut[ki], k1 = kcut[ki + 1], m = k1 - k0;
      const std::string blk = tag + " q[" + std::to_string(q0) + "," + std::to_string(q1) + ") k[" +
                              std::to_string(k0) + "," + std::to_string(k1) + ")";
      const Shape ks{sq.b, sq.h, m, sq.d};
      Tensor kb = make(h, ks, dt, rows_of(kv, sq, sq.d, k0, k1));
      Tensor vb = make(h, ks, dt, rows_of(vv, sq, sq.d, k0, k1));
      Tensor kd = docs ? make(h, {sq.b, m}, DType::i32, doc_rows(doc, sq, k0, k1)) : Tensor();
      Tensor dkb = g.up(kb), dvb = g.up(vb), dkd = docs ? g.up(kd) : Tensor();
      // The host's partial and gradients of this block.
      Tensor po = h.ctx.empty(qs, dt), pl = h.ctx.empty(ls, DType::f32);
      ops::attention_block_fwd(h.ctx, h.s(), qb, kb, vb, po, pl, scale, causal, q0, k0, qd, kd);
      Tensor pdq = h.ctx.empty(qs, dt), pdk = h.ctx.empty(ks, dt), pdv = h.ctx.empty(ks, dt);
      ops::attention_block_bwd(h.ctx, h.s(), qb, kb, vb, ob, gb, lb, pdq, pdk, pdv, scale, causal,
                               q0, k0, qd, kd);
      // The GPU's.
      Tensor gpo = g.ctx.empty(qs, dt), gpl = g.ctx.empty(ls, DType::f32);
      ops::attention_block_fwd(g.ctx, g.s(), dqb, dkb, dvb, gpo, gpl, scale, causal, q0, k0, dqd,
                               dkd);
      Tensor gdq = g.ctx.empty(qs, dt), gdk = g.ctx.empty(ks, dt), gdv = g.ctx.empty(ks, dt);
      ops::attention_block_bwd(g.ctx, g.s(), dqb, dkb, dvb, dob, dgb, dlb, gdq, gdk, gdv, scale,
                               causal, q0, k0, dqd, dkd);
      const Vec gl = g.down(gpl), go = g.down(gpo);
      const Vec gq = g.down(gdq), gk = g.down(gdk), gw = g.down(gdv);
      check_close(go, read(h, po), tol.tol, "partial out " + blk, tol.floor(sq.d));
      check_lse(gl, read(h, pl), lse_tol, "partial lse " + blk);
      check_close(gq, read(h, pdq), tol.tol, "block dq " + blk, tol.floor(sq.d));
      check_close(gk, read(h, pdk), tol.tol, "block dk " + blk, tol.floor(sq.d));
      check_close(gw, read(h, pdv), tol.tol, "block dv " + blk, tol.floor(sq.d));
      // A row that sees no key (check_lse: -inf where the host's is) gets out 0, exactly; a block
      // wholly in the future, or (docs) [100, 149) x [0, 70), has only such rows.
      for (size_t r = 0; r < gl.size(); ++r)
        for (int64_t c = 0; c < sq.d && gl[r] == -kInf; ++c)
          REQUIRE(go[r * static_cast<size_t>(sq.d) + static_cast<size_t>(c)] == 0.0);
      if ((causal && k0 > q1 - 1) || (docs && q0 == 100 && k0 == 0))
        for (double x : gl) REQUIRE(x == -kInf);
      ops::attention_merge(g.ctx, g.s(), acc, acc_lse, gpo, gpl);
      add_rows(bdq, sq, sq.d, q0, q1, gq);
      add_rows(bdk, sq, sq.d, k0, k1, gk);
      add_rows(bdv, sq, sq.d, k0, k1, gw);
    }
    add_rows(mout, sq, sq.d, q0, q1, g.down(acc));
    add_rows(mlse, sq, 1, q0, q1, g.down(acc_lse));
  }
};

// Documents of odd lengths for batch 2 of 149 positions, with boundaries inside the blocks and a
// 1-token document; positions [100, 149) and [0, 70) share no document in either batch row.
Vec odd_docs() { return doc_ids({{1, 36, 3, 60, 49}, {70, 1, 78}}); }

}  // namespace cuda_block

TEST_CASE("cuda attention blocks at offsets match the host and merge to the whole sequence",
          "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  // The reference kernel on f32 and bf16 at head_dim 40 (a partly used 32-column group), flash on
  // bf16 at head_dim 64 (its tiles of 64 rows and keys cut by the blocks).
  struct Run {
    DType dt;
    int64_t d;
    AttentionKernel kernel;
  };
  const Run run = GENERATE(Run{DType::f32, 40, AttentionKernel::Reference},
                           Run{DType::bf16, 40, AttentionKernel::Reference},
                           Run{DType::bf16, 64, AttentionKernel::Flash});
  auto causal = GENERATE(true, false);
  auto docs = GENERATE(false, true);
  ops::set_attention_kernel(run.kernel);
  const bool flash = run.kernel == AttentionKernel::Flash;
  // Odd lengths; query and key cuts differ (a 1-row key block, blocks straddling the diagonal,
  // blocks wholly in the future of some queries).
  cuda_block::Blocks B(g, {2, 2, 149, run.d}, run.dt, causal, docs, cuda_block::odd_docs(), flash);
  const std::string tag = std::string(ops::attention_kernel_name(run.kernel)) + " " +
                          dt_name(run.dt) + " d=" + std::to_string(run.d) +
                          (causal ? " causal" : " full") + (docs ? " docs" : "");
  const std::vector<int64_t> qcut{0, 37, 100, 149}, kcut{0, 70, 71, 149};
  for (size_t qi = 0; qi + 1 < qcut.size(); ++qi) B.run(qcut[qi], qcut[qi + 1], kcut, tag);
  // f32: accumulation order only. bf16: each block's partial output and gradients are rounded to
  // bf16 before they are merged or summed (a bf16 rounding per block on top of the whole
  // sequence's), as in the host's test_attention_block.cpp. Flash adds its rounding of P and dS,
  // whose error follows the row's size (attention_cases.h): its floor takes the row's rms too.
  const double whole = run.dt == DType::f32 ? B.tol.tol : 0.1;
  const Floor wf = flash ? B.tol.floor(run.d) : Floor{0.1};
  check_close(B.mout, B.ov, whole, "merged out " + tag, wf);
  check_close(B.mlse, B.lv, B.lse_tol.tol, "merged lse " + tag, B.lse_tol.floor(1));
  check_close(B.bdq, B.dq, whole, "blocked dq " + tag, wf);
  check_close(B.bdk, B.dk, whole, "blocked dk " + tag, wf);
  check_close(B.bdv, B.dv, whole, "blocked dv " + tag, wf);
}

// tools/gpu-check.sh runs this tag under compute-sanitizer (memcheck, racecheck): the document
// ids are read per (query, key) pair, at rows and keys cut by the tiles' edges.
TEST_CASE("cuda doc-masked attention blocks under compute-sanitizer (small shapes)",
          "[cuda][sanitize]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  struct Run {
    DType dt;
    int64_t d;
    AttentionKernel kernel;
  };
  const Run run = GENERATE(Run{DType::f32, 40, AttentionKernel::Reference},
                           Run{DType::bf16, 64, AttentionKernel::Flash});
  ops::set_attention_kernel(run.kernel);
  cuda_block::Blocks B(g, {2, 1, 149, run.d}, run.dt, true, true, cuda_block::odd_docs(),
                       run.kernel == AttentionKernel::Flash);
  // One query block straddling a flash tile edge against keys before, across and after it.
  B.run(37, 100, {0, 70, 71, 149},
        std::string(ops::attention_kernel_name(run.kernel)) + " " + dt_name(run.dt));
}

TEST_CASE("cuda attention_merge matches the host, an empty side exactly", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  Gpu g;
  Host& h = g.host;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  // Rows 0-2 as the host test: the partial empty, the accumulator empty, both empty; then random
  // rows (head_dim 37: more than one pass of a warp's lanes).
  const int64_t rows = 9, d = 37;
  Vec lse_a = uniform(rows, 21, -3, 3), lse_b = uniform(rows, 22, -3, 3);
  lse_b[0] = -cuda_block::kInf;
  lse_a[1] = -cuda_block::kInf;
  lse_a[2] = lse_b[2] = -cuda_block::kInf;
  Tensor out = rand_tensor(h, {1, rows, d}, dt, 23), part = rand_tensor(h, {1, rows, d}, dt, 24);
  Tensor lse = make(h, {1, rows}, DType::f32, lse_a), plse = make(h, {1, rows}, DType::f32, lse_b);
  Tensor gout = g.up(out), glse = g.up(lse), gpart = g.up(part), gplse = g.up(plse);
  const Vec out0 = read(h, out), part0 = read(h, part);
  ops::attention_merge(g.ctx, g.s(), gout, glse, gpart, gplse);
  const Vec go = g.down(gout), gl = g.down(glse);  // synchronises: the copies up are done
  ops::attention_merge(h.ctx, h.s(), out, lse, part, plse);
  INFO(dt_name(dt));
  for (int64_t c = 0; c < d; ++c) {
    REQUIRE(go[static_cast<size_t>(c)] == out0[static_cast<size_t>(c)]);           // row 0
    REQUIRE(go[static_cast<size_t>(d + c)] == part0[static_cast<size_t>(d + c)]);  // row 1
    REQUIRE(go[static_cast<size_t>(2 * d + c)] == 0.0);                            // row 2
  }
  CHECK(gl[0] == read(h, lse)[0]);
  CHECK(gl[1] == lse_b[1]);
  CHECK(gl[2] == -cuda_block::kInf);
  check_close(go, read(h, out), reference_tol(dt).tol, "merged out " + dt_name(dt));
  cuda_block::check_lse(gl, read(h, lse), reference_lse_tol(), "merged lse " + dt_name(dt));
}
