#include "mesh/linear.h"

#include <map>
#include <mutex>
#include <utility>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

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

void check_input(const char* layer, const std::string& name, const Tensor& x, int64_t features) {
  MESHRT_CHECK(x.defined() && x.ndim() == 3 && x.size(2) == features && x.is_contiguous(),
               layer << " " << name << ": input " << x.str() << " must be a contiguous [seq, "
                     << "batch, " << features << "] tensor");
}

Param make_bias(const DeviceMesh& mesh, const LinearSpec& s, int shard_dim) {
  if (s.bias_std == 0.f)
    return make_param_const(mesh, s.name + ".bias", s.id + 1, {s.out}, shard_dim, s.dtype, 0.0);
  return make_param(mesh, s.name + ".bias", s.id + 1, {s.out}, shard_dim, s.dtype,
                    PhiloxInit{s.seed, 0, PhiloxInit::Dist::Normal, 0.f, s.bias_std});
}

}  // namespace

void accumulate_row_sum(Context& ctx, Stream& s, const Tensor& dy, const Tensor& grad) {
  Tensor d = rows2d(dy);
  Tensor ones = ones_vector(ctx, d.size(0), dy.dtype());
  ops::gemm(ctx, s, ones, false, d, false, grad.view({1, grad.numel()}), 1.f, 1.f);
}

// ---- ColwiseLinear ------------------------------------------------------------------------------

ColwiseLinear::ColwiseLinear(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                             const LinearSpec& s)
    : mesh_(mesh), tp_(tp), opt_(opt), spec_(s) {
  MESHRT_CHECK(s.out % tp.size() == 0, "ColwiseParallel " << s.name << ": out features " << s.out
                                                          << " do not divide by tp=" << tp.size());
  PhiloxInit init{s.seed, 0, PhiloxInit::Dist::Normal, 0.f, s.init_std};
  weight = make_param(mesh, s.name + ".weight", s.id, {s.in, s.out}, 1, s.dtype, init);
  if (s.bias) bias = make_bias(mesh, s, 0);
}

void ColwiseLinear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (spec_.bias) out.push_back(&bias);
}

Tensor ColwiseLinear::forward(const Tensor& x, bool apply_bias) {
  check_input("ColwiseParallel", spec_.name, x, spec_.in);
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const bool sp = opt_.sequence_parallel && tp > 1;
  const int64_t s_loc = x.size(0), b = x.size(1), s = sp ? s_loc * tp : s_loc;
  const int64_t out_l = spec_.out / tp;
  const Tensor* bptr = (spec_.bias && apply_bias) ? &bias.value : nullptr;
  Tensor y = ctx.empty({s, b, out_l}, x.dtype());
  x_saved_ = x;
  x_full_saved_ = Tensor();
  if (!sp) {
    ops::gemm(ctx, cs, x, false, weight.value, false, y, 1.f, 0.f, bptr);
    return y;
  }
  if (opt_.overlap == Overlap::Chunked) {
    // Chunk c of every rank's shard arrives by one all-gather; its tp GEMM pieces start as soon
    // as it is there while later chunks are still in flight.
    MESHRT_CHECK(s_loc % tp == 0, "chunked overlap in " << spec_.name << ": local sequence "
                                                        << s_loc << " must divide by tp=" << tp
                                                        << " (seq divisible by tp^2)");
    const int64_t sc = s_loc / tp;
    std::vector<Tensor> staging;
    std::vector<Event> ready;
    for (int c = 0; c < tp; ++c) {
      staging.push_back(ctx.empty({tp, sc, b, spec_.in}, x.dtype()));
      ready.push_back(tp_.all_gather(x.narrow(0, c * sc, sc), staging.back(), "colwise.ag.chunk"));
    }
    for (int c = 0; c < tp; ++c) {
      tp_.wait(ready[static_cast<size_t>(c)]);
      for (int j = 0; j < tp; ++j)
        ops::gemm(ctx, cs, staging[static_cast<size_t>(c)].select(0, j), false, weight.value, false,
                  y.narrow(0, j * s_loc + c * sc, sc), 1.f, 0.f, bptr);
    }
    return y;
  }
  Tensor x_full = ctx.empty({s, b, spec_.in}, x.dtype());
  tp_.wait(tp_.all_gather(x, x_full, "colwise.ag"));
  ops::gemm(ctx, cs, x_full, false, weight.value, false, y, 1.f, 0.f, bptr);
  return y;
}

Tensor ColwiseLinear::backward(const Tensor& dy, Event* dx_ready, bool apply_bias) {
  MESHRT_CHECK(x_saved_.defined(),
               "ColwiseParallel " << spec_.name << ": backward without forward");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const bool sp = opt_.sequence_parallel && tp > 1;
  const int64_t s_loc = x_saved_.size(0), b = x_saved_.size(1), s = sp ? s_loc * tp : s_loc;
  MESHRT_CHECK(dy.ndim() == 3 && dy.size(0) == s && dy.size(1) == b && dy.size(2) == spec_.out / tp,
               "ColwiseParallel " << spec_.name << ": grad " << dy.str() << " does not match "
                                  << "output [" << s << ", " << b << ", " << spec_.out / tp << "]");
  Event done;
  Tensor dx;
  if (sp) {
    // Megatron: re-gather the input while computing dgrad; reduce-scatter dgrad while computing
    // wgrad.
    Tensor x_full = ctx.empty({s, b, spec_.in}, x_saved_.dtype());
    Event gathered = tp_.all_gather(x_saved_, x_full, "colwise.bwd.ag");
    Tensor dx_partial = ctx.empty({s, b, spec_.in}, dy.dtype());
    ops::gemm(ctx, cs, dy, false, weight.value, true, dx_partial);
    dx = ctx.empty({s_loc, b, spec_.in}, dy.dtype());
    done = tp_.reduce_scatter(dx_partial, dx, "colwise.bwd.rs");
    tp_.wait(gathered);
    ops::gemm(ctx, cs, rows2d(x_full), true, rows2d(dy), false, weight.grad, 1.f, 1.f);
  } else {
    dx = ctx.empty({s, b, spec_.in}, dy.dtype());
    ops::gemm(ctx, cs, dy, false, weight.value, true, dx);
    done = tp_.all_reduce(dx, "colwise.bwd.ar");
    ops::gemm(ctx, cs, rows2d(x_saved_), true, rows2d(dy), false, weight.grad, 1.f, 1.f);
  }
  if (spec_.bias && apply_bias) accumulate_row_sum(ctx, cs, dy, bias.grad);
  x_saved_ = Tensor();
  *dx_ready = done;
  return dx;
}

// ---- RowwiseLinear ------------------------------------------------------------------------------

RowwiseLinear::RowwiseLinear(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                             const LinearSpec& s)
    : mesh_(mesh), tp_(tp), opt_(opt), spec_(s) {
  MESHRT_CHECK(s.in % tp.size() == 0, "RowwiseParallel " << s.name << ": in features " << s.in
                                                         << " do not divide by tp=" << tp.size());
  PhiloxInit init{s.seed, 0, PhiloxInit::Dist::Normal, 0.f, s.init_std};
  weight = make_param(mesh, s.name + ".weight", s.id, {s.in, s.out}, 0, s.dtype, init);
  if (s.bias) bias = make_bias(mesh, s, -1);
}

void RowwiseLinear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (spec_.bias) out.push_back(&bias);
}

Tensor RowwiseLinear::forward(const Tensor& x) {
  const int tp = tp_.size();
  check_input("RowwiseParallel", spec_.name, x, spec_.in / tp);
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const bool sp = opt_.sequence_parallel && tp > 1;
  const int64_t s = x.size(0), b = x.size(1);
  MESHRT_CHECK(!sp || s % tp == 0, "RowwiseParallel " << spec_.name << ": sequence " << s
                                                      << " does not divide by tp=" << tp);
  const int64_t s_loc = sp ? s / tp : s;
  // The bias enters the partial sum once: on tp rank 0 only.
  const Tensor* bptr = (spec_.bias && tp_.rank() == 0) ? &bias.value : nullptr;
  x_saved_ = x;
  Tensor y = ctx.empty({s_loc, b, spec_.out}, x.dtype());
  if (!sp) {
    ops::gemm(ctx, cs, x, false, weight.value, false, y, 1.f, 0.f, bptr);
    tp_.wait(tp_.all_reduce(y, "rowwise.ar"));
    return y;
  }
  if (opt_.overlap == Overlap::Chunked) {
    MESHRT_CHECK(s_loc % tp == 0, "chunked overlap in " << spec_.name << ": local sequence "
                                                        << s_loc << " must divide by tp=" << tp
                                                        << " (seq divisible by tp^2)");
    const int64_t sc = s_loc / tp;
    std::vector<Event> done;
    for (int c = 0; c < tp; ++c) {
      // Rows for chunk c of every rank's shard, then their reduce-scatter, which runs while the
      // next chunk's GEMMs compute.
      Tensor staging = ctx.empty({tp, sc, b, spec_.out}, x.dtype());
      for (int j = 0; j < tp; ++j)
        ops::gemm(ctx, cs, x.narrow(0, j * s_loc + c * sc, sc), false, weight.value, false,
                  staging.select(0, j), 1.f, 0.f, bptr);
      done.push_back(tp_.reduce_scatter(staging, y.narrow(0, c * sc, sc), "rowwise.rs.chunk"));
    }
    for (auto& e : done) tp_.wait(e);
    return y;
  }
  Tensor partial = ctx.empty({s, b, spec_.out}, x.dtype());
  ops::gemm(ctx, cs, x, false, weight.value, false, partial, 1.f, 0.f, bptr);
  tp_.wait(tp_.reduce_scatter(partial, y, "rowwise.rs"));
  return y;
}

Tensor RowwiseLinear::backward(const Tensor& dy) {
  MESHRT_CHECK(x_saved_.defined(),
               "RowwiseParallel " << spec_.name << ": backward without forward");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const bool sp = opt_.sequence_parallel && tp > 1;
  const int64_t s = x_saved_.size(0), b = x_saved_.size(1), s_loc = sp ? s / tp : s;
  MESHRT_CHECK(dy.ndim() == 3 && dy.size(0) == s_loc && dy.size(1) == b && dy.size(2) == spec_.out,
               "RowwiseParallel " << spec_.name << ": grad " << dy.str() << " does not match "
                                  << "output [" << s_loc << ", " << b << ", " << spec_.out << "]");
  Tensor dy_full = dy;
  if (sp) {
    dy_full = ctx.empty({s, b, spec_.out}, dy.dtype());
    tp_.wait(tp_.all_gather(dy, dy_full, "rowwise.bwd.ag"));
  }
  Tensor dx = ctx.empty({s, b, spec_.in / tp}, dy.dtype());
  ops::gemm(ctx, cs, dy_full, false, weight.value, true, dx);
  ops::gemm(ctx, cs, rows2d(x_saved_), true, rows2d(dy_full), false, weight.grad, 1.f, 1.f);
  // dy_full is complete on every rank, so the bias gradient needs no tp reduction.
  if (spec_.bias) accumulate_row_sum(ctx, cs, dy_full, bias.grad);
  x_saved_ = Tensor();
  return dx;
}

}  // namespace meshrt
