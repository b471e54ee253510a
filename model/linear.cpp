#include "model/linear.h"

#include <map>
#include <mutex>
#include <utility>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

ParallelStyle linear_style(const LinearDesc& d, bool sp) {
  switch (d.style) {
    case LinearStyle::Colwise:
      return colwise_parallel(sp);
    case LinearStyle::Rowwise:
      return rowwise_parallel(sp);
  }
  MESHRT_FAIL("linear " << d.name << ": unknown style " << static_cast<int>(d.style));
}

namespace {

Tensor rows2d(const Tensor& t) { return t.view({-1, t.size(-1)}); }

// The all-ones rows accumulate_row_sum multiplies by, one per (dtype, length), kept per rank.
struct OnesVectors {
  std::mutex mu;
  std::map<std::pair<DType, int64_t>, Tensor> by_shape;
};

Tensor ones_vector(Context& ctx, int64_t n, DType dt) {
  auto& cache = ctx.state<OnesVectors>([] { return std::make_shared<OnesVectors>(); });
  std::lock_guard<std::mutex> lk(cache.mu);
  Tensor& t = cache.by_shape[{dt, n}];
  if (!t.defined()) {
    t = ctx.empty({1, n}, dt);
    t.fill_(1.0, ctx.compute_stream());
  }
  return t;
}

}  // namespace

void accumulate_row_sum(Context& ctx, Stream& s, const Tensor& dy, const Tensor& grad) {
  Tensor d = rows2d(dy);
  Tensor ones = ones_vector(ctx, d.size(0), dy.dtype());
  ops::gemm(ctx, s, ones, false, d, false, grad.view({1, grad.numel()}), 1.f, 1.f);
}

Linear::Linear(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const LinearSpec& s,
               ParallelStyle style)
    : mesh_(mesh), tp_(tp), opt_(opt), spec_(s), style_(std::move(style)) {
  PhiloxInit init{s.seed, 0, PhiloxInit::Dist::Normal, 0.f, s.init_std};
  weight = make_param(mesh, s.name + ".weight", s.id, {s.in, s.out},
                      placements_on(mesh, kTpDim, style_.weight), s.dtype, init);
  weight.grad_overwritable = true;  // backward's weight-gradient GEMM is its only writer
  if (!s.bias) return;
  const auto bpl = placements_on(mesh, kTpDim, style_.bias);
  if (s.bias_std == 0.f)
    bias = make_param_const(mesh, s.name + ".bias", s.id + 1, {s.out}, bpl, s.dtype, 0.0);
  else
    bias = make_param(mesh, s.name + ".bias", s.id + 1, {s.out}, bpl, s.dtype,
                      PhiloxInit{s.seed, 0, PhiloxInit::Dist::Normal, 0.f, s.bias_std});
}

void Linear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (spec_.bias) out.push_back(&bias);
}

Tensor Linear::forward(const Tensor& x) {
  const int64_t in_l = weight.value.size(0), out_l = weight.value.size(1);
  MESHRT_CHECK(x.defined() && x.ndim() == 3 && x.size(2) == in_l && x.is_contiguous(),
               style_.name << " " << spec_.name << ": input " << x.str()
                           << " must be a contiguous [seq, batch, " << in_l << "] tensor");
  Context& ctx = mesh_.ctx();
  const int tp = tp_.size();
  const Redistribution rin = style_.in(), rout = style_.out();
  const Shape xs = rin.out_shape(x.shape(), tp);
  const int64_t s = xs[0], b = xs[1];
  // A partial output takes the bias once: on tp rank 0 only.
  const bool has_bias = spec_.bias && !spec_.bias_in_epilogue;
  const Tensor* bptr =
      has_bias && (!rout.from.is_partial() || tp_.rank() == 0) ? &bias.value : nullptr;
  MESHRT_CHECK(
      !(rout.to.is_shard() && !rout.is_identity()) || s % tp == 0,
      style_.name << " " << spec_.name << ": sequence " << s << " does not divide by tp=" << tp);
  Tensor y = ctx.empty(rout.out_shape({s, b, out_l}, tp), x.dtype());
  x_saved_ = x;
  if (!rin.is_identity() && opt_.overlap == Overlap::Chunked)
    return forward_chunked_gather(x, y, bptr);
  if (!rout.is_identity() && rout.to.is_shard() && opt_.overlap == Overlap::Chunked)
    return forward_chunked_scatter(x, y, bptr);
  Stream& cs = tp_.compute();
  Tensor xin = x;
  if (!rin.is_identity()) {
    xin = ctx.empty(xs, x.dtype());
    Event gathered = redistribute(tp_, x, xin, rin, "linear.in");
    if (forward_own_shard_first(style_, opt_.overlap)) {
      gemm_local_first(x, xin, gathered, weight.value, false, y, bptr);
      return y;
    }
    tp_.wait(gathered);
  }
  if (rout.is_identity() || rout.to.is_replicate()) {
    ops::gemm(ctx, cs, xin, false, weight.value, false, y, 1.f, 0.f, bptr);
    tp_.wait(redistribute(tp_, y, y, rout, "linear.out"));
    return y;
  }
  if (tp > 1 && forward_peer_rows_first(style_, opt_.overlap)) {
    gemm_peer_rows_first(xin, y, bptr);
    return y;
  }
  Tensor partial = ctx.empty({s, b, out_l}, x.dtype());
  ops::gemm(ctx, cs, xin, false, weight.value, false, partial, 1.f, 0.f, bptr);
  tp_.wait(redistribute(tp_, partial, y, rout, "linear.out"));
  return y;
}

// out = gathered @ op(w), row block by row block of the sequence shards: this rank's own shard
// (`local`, which the all-gather into `gathered` copies) first, while the all-gather is still
// in flight, the other ranks' shards once it completed. Each output row is the same GEMM row as
// in one whole GEMM: the unsplit result bit for bit where the GEMM rounds a row independently of
// the row count (oneDNN, OpenBLAS's AVX-512 kernels), within rounding otherwise (its Haswell ones).
void Linear::gemm_local_first(const Tensor& local, const Tensor& gathered, const Event& done,
                              const Tensor& w, bool trans_w, const Tensor& out,
                              const Tensor* bptr) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size(), me = tp_.rank();
  const int64_t s_loc = local.size(0);
  ops::gemm(ctx, cs, local, false, w, trans_w, out.narrow(0, me * s_loc, s_loc), 1.f, 0.f, bptr);
  tp_.wait(done);
  for (int j = 0; j < tp; ++j) {
    if (j == me) continue;
    ops::gemm(ctx, cs, gathered.narrow(0, j * s_loc, s_loc), false, w, trans_w,
              out.narrow(0, j * s_loc, s_loc), 1.f, 0.f, bptr);
  }
}

// y = this rank's sequence shard of the sum over tp of x @ w's partial outputs, as a
// reduce-scatter gives it, with the rows the other ranks own computed first: they go out in one
// exchange while this rank's own rows compute, and the compute stream waits only after that. A
// peer running up to a shard's GEMM behind then costs no waiting, where a reduce-scatter after
// the whole GEMM waits for the slowest rank (TransformerEngine's ring-exchange reduce-scatter
// computes the next rank's chunk first for the same reason). The sum runs in rank order in f32,
// rounded once, as the host reduce-scatter's: the same bits wherever the GEMM rounds a row
// independently of the row count.
void Linear::gemm_peer_rows_first(const Tensor& x, const Tensor& y, const Tensor* bptr) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size(), me = tp_.rank();
  const int64_t s_loc = y.size(0);
  auto rows = [&](int j, const Tensor& out) {
    ops::gemm(ctx, cs, x.narrow(0, j * s_loc, s_loc), false, weight.value, false, out, 1.f, 0.f,
              bptr);
  };
  // Block j: the rows rank j owns, exchanged in place for rank j's partial of this rank's rows
  // (the reduce-scatter's memory: one buffer of the full output). The own block stays here;
  // zeros, not stale memory, for the exchange to pass over.
  Tensor blocks = ctx.empty({tp, s_loc, y.size(1), y.size(2)}, y.dtype());
  for (int k = 1; k < tp; ++k) rows((me + k) % tp, blocks.select(0, (me + k) % tp));
  blocks.select(0, me).fill_(0.0, cs);
  const Event done = tp_.exchange(blocks, blocks, "linear.out.exchange");
  rows(me, y);
  tp_.wait(done);
  auto part = [&](int j) { return j == me ? y : blocks.select(0, j); };
  if (tp == 2 || y.dtype() == DType::f32) {
    // ((p0 + p1) + p2) + ... in the own block, the last addition into y.
    const Tensor acc = blocks.select(0, me);
    for (int j = 1; j < tp; ++j)
      ops::add(ctx, cs, j == 1 ? part(0) : acc, part(j), j == tp - 1 ? y : acc);
    return;
  }
  // 16-bit over more than two ranks: accumulate in f32, round once.
  Tensor acc = ctx.empty(y.shape(), DType::f32), wide = ctx.empty(y.shape(), DType::f32);
  ops::cast(ctx, cs, part(0), acc);
  for (int j = 1; j < tp; ++j) {
    ops::cast(ctx, cs, part(j), wide);
    ops::add(ctx, cs, acc, wide, acc);
  }
  ops::cast(ctx, cs, acc, y);
}

// Chunk c of every rank's sequence shard arrives by one all-gather; its tp GEMM pieces start as
// soon as it is there while later chunks are still in flight.
Tensor Linear::forward_chunked_gather(const Tensor& x, const Tensor& y, const Tensor* bptr) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const int64_t s_loc = x.size(0), b = x.size(1), in = x.size(2);
  MESHRT_CHECK(s_loc % tp == 0, "chunked overlap in " << spec_.name << ": local sequence " << s_loc
                                                      << " must divide by tp=" << tp
                                                      << " (seq divisible by tp^2)");
  const int64_t sc = s_loc / tp;
  std::vector<Tensor> staging;
  std::vector<Event> ready;
  for (int c = 0; c < tp; ++c) {
    staging.push_back(ctx.empty({tp, sc, b, in}, x.dtype()));
    ready.push_back(
        redistribute(tp_, x.narrow(0, c * sc, sc), staging.back(), style_.in(), "linear.in.chunk"));
  }
  for (int c = 0; c < tp; ++c) {
    tp_.wait(ready[static_cast<size_t>(c)]);
    for (int j = 0; j < tp; ++j)
      ops::gemm(ctx, cs, staging[static_cast<size_t>(c)].select(0, j), false, weight.value, false,
                y.narrow(0, j * s_loc + c * sc, sc), 1.f, 0.f, bptr);
  }
  return y;
}

// Rows for chunk c of every rank's output shard, then their reduce-scatter, which runs while the
// next chunk's GEMMs compute.
Tensor Linear::forward_chunked_scatter(const Tensor& x, const Tensor& y, const Tensor* bptr) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const int64_t s_loc = y.size(0), b = y.size(1), out = y.size(2);
  MESHRT_CHECK(s_loc % tp == 0, "chunked overlap in " << spec_.name << ": local sequence " << s_loc
                                                      << " must divide by tp=" << tp
                                                      << " (seq divisible by tp^2)");
  const int64_t sc = s_loc / tp;
  std::vector<Event> done;
  for (int c = 0; c < tp; ++c) {
    Tensor staging = ctx.empty({tp, sc, b, out}, x.dtype());
    for (int j = 0; j < tp; ++j)
      ops::gemm(ctx, cs, x.narrow(0, j * s_loc + c * sc, sc), false, weight.value, false,
                staging.select(0, j), 1.f, 0.f, bptr);
    done.push_back(
        redistribute(tp_, staging, y.narrow(0, c * sc, sc), style_.out(), "linear.out.chunk"));
  }
  for (auto& e : done) tp_.wait(e);
  return y;
}

InputGrad Linear::backward(const Tensor& dy) {
  MESHRT_CHECK(x_saved_.defined(),
               style_.name << " " << spec_.name << ": backward without forward");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const Redistribution rin = style_.in(), rout = style_.out();
  const Shape xs = rin.out_shape(x_saved_.shape(), tp);
  const Shape ys = rout.out_shape({xs[0], xs[1], weight.value.size(1)}, tp);
  MESHRT_CHECK(dy.shape() == ys, style_.name << " " << spec_.name << ": grad " << dy.str()
                                             << " does not match output " << ys.str());
  // The output's gradient back to what the local GEMMs wrote (Megatron: the sequence all-gather
  // of dy before a rowwise GEMM).
  const Redistribution gout = rout.grad(), gin = rin.grad();
  // Under Async and Chunked, the dgrad rows of this rank's own dy shard run while that gather
  // is in flight.
  Tensor dyc = dy;
  Event dy_gathered;
  const bool split_dgrad = dgrad_own_shard_first(style_, opt_.overlap);
  if (!gout.is_identity()) {
    dyc = ctx.empty(gout.out_shape(dy.shape(), tp), dy.dtype());
    dy_gathered = redistribute(tp_, dy, dyc, gout, "linear.bwd.out");
    if (!split_dgrad) tp_.wait(dy_gathered);
  }
  // Megatron: re-gather the input while computing dgrad; reduce (-scatter) dgrad while
  // computing wgrad.
  Tensor x_full = x_saved_;
  Event gathered;
  if (!rin.is_identity()) {
    x_full = ctx.empty(xs, x_saved_.dtype());
    gathered = redistribute(tp_, x_saved_, x_full, rin, "linear.bwd.regather");
  }
  InputGrad g;
  Tensor dx_local = ctx.empty(xs, dy.dtype());
  if (split_dgrad)
    gemm_local_first(dy, dyc, dy_gathered, weight.value, true, dx_local, nullptr);
  else
    ops::gemm(ctx, cs, dyc, false, weight.value, true, dx_local);
  if (gin.is_identity() || gin.to.is_replicate()) {
    g.dx = dx_local;
  } else {
    g.dx = ctx.empty(x_saved_.shape(), dy.dtype());
  }
  g.ready = redistribute(tp_, dx_local, g.dx, gin, "linear.bwd.in");
  tp_.wait(gathered);
  const float wbeta = take_grad_overwrite(weight) ? 0.f : 1.f;
  ops::gemm(ctx, cs, rows2d(x_full), true, rows2d(dyc), false, weight.grad, 1.f, wbeta);
  // dyc is complete on every rank where the output was reduced, so the bias gradient needs no
  // tp reduction.
  if (spec_.bias && !spec_.bias_in_epilogue) accumulate_row_sum(ctx, cs, dyc, bias.grad);
  x_saved_ = Tensor();
  return g;
}

}  // namespace meshrt
