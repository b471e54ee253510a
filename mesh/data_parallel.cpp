#include "mesh/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

GradSync::GradSync(DeviceMesh& mesh, std::vector<Param*> params, DpOptions opts, int grad_sets)
    : mesh_(mesh),
      opts_(opts),
      dp_(mesh, kDpDim, opts.overlap),
      params_(std::move(params)),
      sets_(grad_sets) {
  MESHRT_CHECK(opts.bucket_mb > 0,
               "data parallel: bucket size " << opts.bucket_mb << " MiB must be positive");
  MESHRT_CHECK(grad_sets >= 1, "data parallel: grad_sets " << grad_sets << " < 1");
  const double cap = opts.bucket_mb * 1024.0 * 1024.0;
  // Pack in reverse forward order: the order backward finishes gradients.
  Bucket cur;
  double cur_bytes = 0;
  where_.assign(params_.size(), {-1, -1});
  auto close = [&] {
    if (!cur.params.empty()) buckets_.push_back(std::move(cur));
    cur = Bucket();
    cur_bytes = 0;
  };
  for (size_t k = params_.size(); k-- > 0;) {
    Param* p = params_[k];
    MESHRT_CHECK(p && p->value.defined(), "data parallel: parameter " << k << " is undefined");
    const double bytes = static_cast<double>(p->value.nbytes());
    if (!cur.params.empty() && (cur_bytes + bytes > cap || cur.dtype != p->value.dtype())) close();
    if (cur.params.empty()) cur.dtype = p->value.dtype();
    where_[k] = {static_cast<int>(buckets_.size()), static_cast<int>(cur.params.size())};
    cur.offsets.push_back(cur.numel);
    cur.params.push_back(p);
    cur.numel += p->value.numel();
    cur_bytes += bytes;
  }
  close();
  Context& ctx = mesh.ctx();
  for (auto& b : buckets_) {
    for (int s = 0; s < sets_; ++s) {
      b.flat.push_back(ctx.zeros({b.numel}, b.dtype));
      if (opts.bf16_comm && b.dtype == DType::f32)
        b.comm_buf.push_back(ctx.empty({b.numel}, DType::bf16));
    }
    b.done.assign(static_cast<size_t>(sets_), Event());
    b.launched.assign(static_cast<size_t>(sets_), false);
  }
  bind(0);
}

std::vector<std::string> GradSync::bucket_params(int b) const {
  std::vector<std::string> names;
  for (Param* p : buckets_[static_cast<size_t>(b)].params) names.push_back(p->name);
  return names;
}

size_t GradSync::bucket_bytes(int b) const {
  const Bucket& bk = buckets_[static_cast<size_t>(b)];
  return static_cast<size_t>(bk.numel) * dtype_size(bk.dtype);
}

void GradSync::bind(int grad_set) {
  MESHRT_CHECK(grad_set >= 0 && grad_set < sets_,
               "GradSync: grad set " << grad_set << " not in [0, " << sets_ << ")");
  for (auto& b : buckets_)
    for (size_t i = 0; i < b.params.size(); ++i) {
      Param* p = b.params[i];
      p->grad = b.flat[static_cast<size_t>(grad_set)]
                    .narrow(0, b.offsets[i], p->value.numel())
                    .view(p->value.shape());
    }
  active_ = grad_set;
}

void GradSync::set_active(int grad_set) {
  bind(grad_set);
  for (auto& b : buckets_) {
    b.ready = 0;
    b.launched[static_cast<size_t>(grad_set)] = false;
  }
}

void GradSync::zero_grad() {
  for (auto& b : buckets_) b.flat[static_cast<size_t>(active_)].zero_(mesh_.ctx().compute_stream());
}

void GradSync::launch(Bucket& b) {
  const size_t s = static_cast<size_t>(active_);
  if (b.launched[s]) return;
  b.launched[s] = true;
  if (probe_.defined()) ops::sum_squares(mesh_.ctx(), dp_.compute(), b.flat[s], probe_);
  if (dp_.size() == 1) {
    b.done[s] = Event();
    return;
  }
  Context& ctx = mesh_.ctx();
  if (!b.comm_buf.empty()) {
    ops::cast(ctx, dp_.compute(), b.flat[s], b.comm_buf[s]);
    b.done[s] = dp_.all_reduce(b.comm_buf[s], "dp.grad.bucket", ReduceOp::Avg);
  } else {
    b.done[s] = dp_.all_reduce(b.flat[s], "dp.grad.bucket", ReduceOp::Avg);
  }
}

void GradSync::mark_ready(const std::vector<Param*>& ps) {
  if (!sync_enabled_) return;  // accumulation micro-batch: nothing to launch, nothing to count
  for (Param* p : ps) {
    auto it = std::find(params_.begin(), params_.end(), p);
    MESHRT_CHECK(it != params_.end(),
                 "GradSync: parameter " << (p ? p->name : "null") << " is not managed here");
    auto [bi, slot] = where_[static_cast<size_t>(it - params_.begin())];
    (void)slot;
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    b.ready++;
    if (b.ready == static_cast<int>(b.params.size())) launch(b);
  }
}

void GradSync::finish() {
  if (!sync_enabled_) return;
  for (auto& b : buckets_) launch(b);
}

void GradSync::wait_bucket(int bi, int grad_set) {
  const size_t s = static_cast<size_t>(grad_set < 0 ? active_ : grad_set);
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (!b.launched[s] || dp_.size() == 1) return;
  dp_.wait(b.done[s]);
  b.done[s] = Event();
  if (!b.comm_buf.empty()) ops::cast(mesh_.ctx(), dp_.compute(), b.comm_buf[s], b.flat[s]);
  b.launched[s] = false;
}

void GradSync::wait_all(int grad_set) {
  for (int b = 0; b < num_buckets(); ++b) wait_bucket(b, grad_set);
}

void GradSync::broadcast_params() {
  if (dp_.size() == 1) return;
  std::vector<Event> evs;
  for (Param* p : params_) evs.push_back(dp_.broadcast(p->value, 0, "dp.param.broadcast"));
  for (auto& e : evs) dp_.wait(e);
}

void GradSync::verify_params_identical() {
  if (dp_.size() == 1) return;
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  // max and min over replicas of every parameter: equal everywhere iff identical.
  for (Param* p : params_) {
    Tensor hi = ctx.empty(p->value.shape(), DType::f32),
           lo = ctx.empty(p->value.shape(), DType::f32);
    ops::cast(ctx, cs, p->value, hi);
    ops::cast(ctx, cs, p->value, lo);
    dp_.wait(dp_.all_reduce(hi, "dp.verify", ReduceOp::Max));
    dp_.wait(dp_.all_reduce(lo, "dp.verify", ReduceOp::Min));
    Tensor h = hi.to(ctx.host_allocator(), cs), l = lo.to(ctx.host_allocator(), cs);
    cs.synchronize();
    const float* a = h.data<float>();
    const float* c = l.data<float>();
    for (int64_t i = 0; i < h.numel(); ++i)
      MESHRT_CHECK(a[i] == c[i] || (std::isnan(a[i]) && std::isnan(c[i])),
                   "data parallel: parameter " << p->name << " differs between dp replicas "
                                               << "(first at element " << i << ": max " << a[i]
                                               << ", min " << c[i]
                                               << "); initialise with the same seed or call "
                                                  "broadcast_params()");
  }
}

void GradSync::average_params() {
  if (dp_.size() == 1) return;
  std::vector<Event> evs;
  for (Param* p : params_) evs.push_back(dp_.all_reduce(p->value, "dp.param.avg", ReduceOp::Avg));
  for (auto& e : evs) dp_.wait(e);
}

}  // namespace meshrt
