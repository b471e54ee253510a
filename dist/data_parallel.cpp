#include "dist/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

void validate_zero_stage(int zero) {
  MESHRT_CHECK(zero >= 0 && zero <= 3,
               "train: --zero " << zero
                                << " is not a supported ZeRO stage: use 0 (replicated), 1 (shard "
                                   "the optimizer state), 2 (also the gradients) or 3 (also the "
                                   "parameters)");
}

namespace {
// Stage 3: the piece of each parameter (forward order), checked to partition `params`.
std::vector<int> piece_of_params(const std::vector<Param*>& params,
                                 const std::vector<std::vector<Param*>>& pieces) {
  std::vector<int> out;
  for (size_t k = 0; k < pieces.size(); ++k)
    for (size_t i = 0; i < pieces[k].size(); ++i) {
      MESHRT_CHECK(out.size() < params.size() && params[out.size()] == pieces[k][i],
                   "data parallel: --zero 3's piece " << k << " parameter " << i
                                                      << " is not the next of the " << params.size()
                                                      << " parameters in order");
      out.push_back(static_cast<int>(k));
    }
  MESHRT_CHECK(out.size() == params.size(), "data parallel: --zero 3's pieces hold "
                                                << out.size() << " of the " << params.size()
                                                << " parameters; pass every one");
  return out;
}
}  // namespace

GradSync::GradSync(DeviceMesh& mesh, std::vector<Param*> params, DpOptions opts, int grad_sets,
                   std::vector<std::vector<Param*>> pieces)
    : mesh_(mesh),
      opts_(opts),
      dp_(mesh, mesh.grad_dim(), opts.overlap),
      params_(std::move(params)),
      sets_(grad_sets) {
  MESHRT_CHECK(opts.bucket_mb > 0,
               "data parallel: bucket size " << opts.bucket_mb << " MiB must be positive");
  MESHRT_CHECK(grad_sets >= 1, "data parallel: grad_sets " << grad_sets << " < 1");
  validate_zero_stage(opts.zero);
  MESHRT_CHECK(!opts.deterministic || (grad_sets == 1 && !opts.bf16_comm),
               "data parallel: --deterministic reduces one gradient set in f32 (got "
                   << grad_sets << " sets" << (opts.bf16_comm ? ", --bf16-grads" : "")
                   << "); use --grad-sync sync without --bf16-grads");
  MESHRT_CHECK(!opts.deterministic || mesh.size(kCpDim) == 1,
               "data parallel: --deterministic sums each sequence's gradient whole, and cp="
                   << mesh.size(kCpDim) << " splits the sequences over ranks; drop one of them");
  MESHRT_CHECK(opts.zero == 0 || grad_sets == 1, "data parallel: --zero "
                                                     << opts.zero << " keeps one gradient set, not "
                                                     << grad_sets << " (use --grad-sync sync)");
  MESHRT_CHECK(opts.zero < 3 || !pieces.empty(),
               "data parallel: --zero 3 needs the model's pieces (GradSync's `pieces`)");
  const std::vector<int> piece_of =
      opts.zero == 3 ? piece_of_params(params_, pieces) : std::vector<int>();
  if (opts.zero == 3) piece_buckets_.resize(pieces.size());
  piece_gathered_.assign(piece_buckets_.size(), true);  // whole until shard_params()
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
    // Stage 3: a bucket never spans two pieces (a piece gathers its own buckets only).
    const bool new_piece =
        !piece_of.empty() && k + 1 < params_.size() && piece_of[k] != piece_of[k + 1];
    if (!cur.params.empty() &&
        (cur_bytes + bytes > cap || cur.dtype != p->value.dtype() || new_piece))
      close();
    if (cur.params.empty()) {
      cur.dtype = p->value.dtype();
      if (!piece_of.empty())
        piece_buckets_[static_cast<size_t>(piece_of[k])].push_back(
            static_cast<int>(buckets_.size()));
    }
    where_[k] = {static_cast<int>(buckets_.size()), static_cast<int>(cur.params.size())};
    cur.offsets.push_back(cur.numel);
    cur.shapes.push_back(p->value.shape());
    cur.params.push_back(p);
    cur.numel += p->value.numel();
    cur_bytes += bytes;
  }
  close();
  Context& ctx = mesh.ctx();
  Stream& cs = ctx.compute_stream();
  const int64_t dp = dp_.size();
  // The parameters' own gradients give way to the buckets' (freed first: no moment holds both).
  for (Param* p : params_) p->grad = Tensor();
  for (auto& b : buckets_) {
    // ZeRO pads the flat buffers to a multiple of dp (zero padding: it adds nothing to sums).
    // (--deterministic: too, its reduction is a reduce-scatter into dp equal chunks.)
    b.padded = opts.zero > 0 || opts.deterministic ? (b.numel + dp - 1) / dp * dp : b.numel;
    if (opts.zero > 0) {
      // The parameters move into one flat buffer per bucket, so a rank's updated shard is
      // all-gathered in place; each bucket's old tensors are freed before the next is moved.
      b.values = ctx.zeros({b.padded}, b.dtype);
      for (size_t i = 0; i < b.params.size(); ++i) {
        Param* p = b.params[i];
        Tensor v = b.values.narrow(0, b.offsets[i], p->value.numel());
        v.copy_(p->value.contiguous(cs).view({p->value.numel()}), cs);
        p->value = v.view(p->value.shape());
      }
      cs.synchronize();
      // Stage 3 on dp = 1: the shard is the whole buffer.
      if (opts.zero == 3) b.param_shard = dp == 1 ? b.values : ctx.zeros({b.padded / dp}, b.dtype);
    }
    // Stage 2 allocates the full buckets only for the backward that fills them (prepare_grads).
    const bool full = opts.zero < 2;
    for (int s = 0; s < sets_; ++s) {
      b.flat.push_back(full ? ctx.zeros({b.padded}, b.dtype) : Tensor());
      if (opts.bf16_comm && b.dtype == DType::f32)
        b.comm_buf.push_back(full ? ctx.empty({b.padded}, DType::bf16) : Tensor());
      if (opts.zero >= 2) b.grad_shard.push_back(ctx.zeros({b.padded / dp}, b.dtype));
    }
    b.done.assign(static_cast<size_t>(sets_), Event());
    b.launched.assign(static_cast<size_t>(sets_), false);
  }
  bind(0);
}

int64_t GradSync::shard_numel(int b) const {
  return buckets_[static_cast<size_t>(b)].padded / dp_.size();
}

int64_t GradSync::bucket_offset(int b, int slot) const {
  return buckets_[static_cast<size_t>(b)].offsets[static_cast<size_t>(slot)];
}

Tensor GradSync::param_shard(int bi) const {
  MESHRT_CHECK(opts_.zero > 0, "GradSync: param_shard needs --zero 1, 2 or 3");
  const Bucket& b = buckets_[static_cast<size_t>(bi)];
  const int64_t s = shard_numel(bi);
  return opts_.zero == 3 ? b.param_shard : b.values.narrow(0, dp_.rank() * s, s);
}

std::vector<ShardPiece> GradSync::shard_pieces(int bi) const {
  MESHRT_CHECK(opts_.zero > 0, "GradSync: shard_pieces needs --zero 1, 2 or 3");
  const Bucket& b = buckets_[static_cast<size_t>(bi)];
  const int64_t s = shard_numel(bi), lo = dp_.rank() * s, hi = std::min(lo + s, b.numel);
  const Tensor& flat = b.flat[static_cast<size_t>(active_)];
  std::vector<ShardPiece> out;
  for (size_t i = 0; i < b.params.size(); ++i) {
    const int64_t a = std::max(lo, b.offsets[i]),
                  e = std::min(hi, b.offsets[i] + b.shapes[i].numel());
    if (e <= a) continue;
    ShardPiece pc;
    pc.param = b.params[i];
    pc.at = a - lo;
    pc.len = e - a;
    pc.offset = a - b.offsets[i];
    pc.value =
        opts_.zero == 3 ? b.param_shard.narrow(0, pc.at, pc.len) : b.values.narrow(0, a, pc.len);
    pc.grad = opts_.zero >= 2 ? b.grad_shard[static_cast<size_t>(active_)].narrow(0, pc.at, pc.len)
                              : flat.narrow(0, a, pc.len);
    out.push_back(std::move(pc));
  }
  return out;
}

void GradSync::gather_params(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  // Stage 3 gathers in the next forward instead.
  if (opts_.zero == 0 || opts_.zero == 3 || dp_.size() == 1) return;
  const int64_t s = shard_numel(bi);
  b.gathered = dp_.all_gather(b.values.narrow(0, dp_.rank() * s, s), b.values, "dp.param.gather");
}

void GradSync::wait_gathers() {
  for (auto& b : buckets_) {
    dp_.wait(b.gathered);
    b.gathered = Event();
  }
}

GradSync::Bucket& GradSync::bucket_of(const Param* p) {
  auto it = std::find(params_.begin(), params_.end(), p);
  MESHRT_CHECK(it != params_.end(),
               "GradSync: parameter " << (p ? p->name : "null") << " is not managed here");
  return buckets_[static_cast<size_t>(where_[static_cast<size_t>(it - params_.begin())].first)];
}

void GradSync::bind_values(Bucket& b) {
  for (size_t i = 0; i < b.params.size(); ++i)
    b.params[i]->value = b.values.narrow(0, b.offsets[i], b.shapes[i].numel()).view(b.shapes[i]);
}

void GradSync::launch_param_gather(Bucket& b) {
  if (dp_.size() == 1) {
    b.values = b.param_shard;  // the shard is the whole bucket: nothing to gather or free
  } else {
    b.values = mesh_.ctx().empty({b.padded}, b.dtype);
    b.gathered = dp_.all_gather(b.param_shard, b.values, "dp.param.gather");
  }
  bind_values(b);
}

void GradSync::gather_piece(int k, int prefetch) {
  if (opts_.zero != 3) return;
  MESHRT_CHECK(k >= 0 && k < num_pieces() && prefetch < num_pieces(),
               "GradSync: piece " << k << " (prefetch " << prefetch << ") is not one of the "
                                  << num_pieces() << " pieces given to the constructor");
  for (int p : {k, prefetch}) {
    if (p < 0 || piece_gathered_[static_cast<size_t>(p)]) continue;
    // The rate limit: the issuing thread runs ahead of the compute stream, and a released
    // piece's buffers live until the compute queued on them is done.
    int live = 0;
    for (bool g : piece_gathered_) live += g ? 1 : 0;
    while (!released_.empty() && live + static_cast<int>(released_.size()) >= kMaxGatheredPieces) {
      released_.front().synchronize();
      released_.erase(released_.begin());
    }
    for (int bi : piece_buckets_[static_cast<size_t>(p)])
      launch_param_gather(buckets_[static_cast<size_t>(bi)]);
    piece_gathered_[static_cast<size_t>(p)] = true;
  }
  for (int bi : piece_buckets_[static_cast<size_t>(k)]) {
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    dp_.wait(b.gathered);
    b.gathered = Event();
  }
}

void GradSync::release_piece(int k) {
  if (opts_.zero != 3) return;
  MESHRT_CHECK(k >= 0 && k < num_pieces(), "GradSync: piece "
                                               << k << " is not one of the " << num_pieces()
                                               << " pieces given to the constructor");
  piece_gathered_[static_cast<size_t>(k)] = false;
  for (int bi : piece_buckets_[static_cast<size_t>(k)]) {
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    b.values = Tensor();
    for (Param* p : b.params) p->value = Tensor();
  }
  if (dp_.size() > 1) released_.push_back(mesh_.ctx().compute_stream().record());
}

void GradSync::gather_all_params() {
  if (opts_.zero != 3) return;
  for (int k = 0; k < num_pieces(); ++k)
    if (!piece_gathered_[static_cast<size_t>(k)]) {
      for (int bi : piece_buckets_[static_cast<size_t>(k)])
        launch_param_gather(buckets_[static_cast<size_t>(bi)]);
      piece_gathered_[static_cast<size_t>(k)] = true;
    }
  wait_gathers();
  mesh_.ctx().compute_stream().synchronize();
}

void GradSync::shard_params() {
  if (opts_.zero != 3) return;
  Stream& cs = mesh_.ctx().compute_stream();
  for (int k = 0; k < num_pieces(); ++k) {
    if (!piece_gathered_[static_cast<size_t>(k)]) continue;
    for (int bi : piece_buckets_[static_cast<size_t>(k)]) {
      Bucket& b = buckets_[static_cast<size_t>(bi)];
      const int64_t s = b.padded / dp_.size();
      if (dp_.size() > 1) b.param_shard.copy_(b.values.narrow(0, dp_.rank() * s, s), cs);
    }
    cs.synchronize();
    release_piece(k);
  }
  released_.clear();  // synchronised above
}

void GradSync::allocate_full(Bucket& b, size_t s) {
  Context& ctx = mesh_.ctx();
  b.flat[s] = ctx.zeros({b.padded}, b.dtype);
  if (!b.comm_buf.empty()) b.comm_buf[s] = ctx.empty({b.padded}, DType::bf16);
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
      const Tensor& flat = b.flat[static_cast<size_t>(grad_set)];
      // Stage 2 frees the full buckets once reduced: no full gradient until zero_grad.
      p->grad = flat.defined() ? flat.narrow(0, b.offsets[i], b.shapes[i].numel()).view(b.shapes[i])
                               : Tensor();
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

void GradSync::zero_grad(bool first_write_requested) {
  const size_t s = static_cast<size_t>(active_);
  in_flight_.clear();
  Stream& cs = mesh_.ctx().compute_stream();
  // First-write gradients (Param::grad_overwritable) with one gradient set and no ZeRO padding or
  // sharded gradients: the bucket's other parameters are zeroed, the overwritable ones marked.
  const bool first_write = first_write_requested && sets_ == 1 && opts_.zero == 0;
  for (auto& b : buckets_) {
    if (first_write) {
      for (Param* p : b.params) {
        p->grad_unwritten = p->grad_overwritable;
        if (!p->grad_unwritten) p->grad.zero_(cs);
      }
      continue;
    }
    if (b.flat[s].defined()) b.flat[s].zero_(cs);
    if (opts_.zero >= 2) b.grad_shard[s].zero_(cs);
  }
}

void GradSync::zero_unwritten(const std::vector<Param*>& ps) {
  Stream& cs = mesh_.ctx().compute_stream();
  for (Param* p : ps)
    if (take_grad_overwrite(*p)) p->grad.zero_(cs);
}

void GradSync::prepare_grads(const std::vector<Param*>& ps) {
  if (opts_.zero < 2) return;
  const size_t s = static_cast<size_t>(active_);
  for (Param* p : ps) {
    Bucket& b = bucket_of(p);
    if (b.flat[s].defined()) continue;
    allocate_full(b, s);
    for (size_t i = 0; i < b.params.size(); ++i)
      b.params[i]->grad = b.flat[s].narrow(0, b.offsets[i], b.shapes[i].numel()).view(b.shapes[i]);
  }
}

ReduceOp GradSync::grad_op(const Tensor& flat) {
  // Under cp the ranks of a cp group hold partial sums over their tokens of one replica's
  // gradient: summed over cp, averaged over dp (scaled by 1 / dp first, then summed).
  const int cp = mesh_.size(kCpDim);
  if (cp == 1) return ReduceOp::Avg;
  if (dp_.size() > cp)
    ops::scale(mesh_.ctx(), dp_.compute(), flat, flat, 1.f / static_cast<float>(dp_.size() / cp));
  return ReduceOp::Sum;
}

void GradSync::launch(Bucket& b) {
  const size_t s = static_cast<size_t>(active_);
  if (b.launched[s]) return;
  b.launched[s] = true;
  if (probe_.defined()) ops::sum_squares(mesh_.ctx(), dp_.compute(), b.flat[s], probe_);
  if (opts_.zero >= 2) {
    launch_reduce_scatter(b, s);
    return;
  }
  if (dp_.size() == 1) {
    b.done[s] = Event();
    return;
  }
  Context& ctx = mesh_.ctx();
  const ReduceOp op = grad_op(b.flat[s]);
  if (!b.comm_buf.empty()) {
    ops::cast(ctx, dp_.compute(), b.flat[s], b.comm_buf[s]);
    b.done[s] = dp_.all_reduce(b.comm_buf[s], "dp.grad.bucket", op);
  } else {
    b.done[s] = dp_.all_reduce(b.flat[s], "dp.grad.bucket", op);
  }
}

void GradSync::launch_reduce_scatter(Bucket& b, size_t s) {
  Context& ctx = mesh_.ctx();
  const int64_t n = b.padded / dp_.size();
  if (!b.flat[s].defined()) allocate_full(b, s);  // no backward wrote it: zero gradients
  // The averaged shard; the full bucket (held by the collective until it is done) is freed.
  const ReduceOp op = grad_op(b.flat[s]);
  if (!b.comm_buf.empty()) {
    ops::cast(ctx, dp_.compute(), b.flat[s], b.comm_buf[s]);
    b.comm_stage = ctx.empty({n}, DType::bf16);
    b.done[s] = dp_.reduce_scatter(b.comm_buf[s], b.comm_stage, "dp.grad.reduce_scatter", op);
    b.comm_buf[s] = Tensor();
  } else {
    b.done[s] = dp_.reduce_scatter(b.flat[s], b.grad_shard[s], "dp.grad.reduce_scatter", op);
  }
  b.flat[s] = Tensor();
  for (Param* p : b.params) p->grad = Tensor();
  // Rate limit (as FSDP's limit_all_gathers): the issuing thread runs ahead of the streams, and a
  // bucket is freed only when its reduce-scatter is done; waiting here for the one two buckets
  // back bounds the full buckets alive to three.
  in_flight_.push_back(&b);
  if (in_flight_.size() > 2) {
    Bucket& old = *in_flight_.front();
    in_flight_.erase(in_flight_.begin());
    if (old.done[s].valid()) old.done[s].synchronize();
    old.done[s] = Event();
  }
}

void GradSync::mark_ready(const std::vector<Param*>& ps, CommScheduler* writes_on) {
  zero_unwritten(ps);          // their backward is done: what it did not write is zero
  if (!sync_enabled_) return;  // accumulation micro-batch: nothing to launch, nothing to count
  // What launch() reads the bucket for: the probe, the reduce-scatter, the all-reduce.
  const bool reads = probe_.defined() || opts_.zero >= 2 || dp_.size() > 1;
  for (Param* p : ps) {
    Bucket& b = bucket_of(p);
    b.ready++;
    if (b.ready != static_cast<int>(b.params.size())) continue;
    if (reads && writes_on) writes_on->settle_grad_writes();
    launch(b);
  }
}

void GradSync::finish() {
  for (auto& b : buckets_) zero_unwritten(b.params);
  if (!sync_enabled_) return;
  for (auto& b : buckets_) launch(b);
}

void GradSync::wait_bucket(int bi, int grad_set) {
  const size_t s = static_cast<size_t>(grad_set < 0 ? active_ : grad_set);
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (!b.launched[s]) return;
  if (opts_.zero >= 2) {
    dp_.wait(b.done[s]);
    b.done[s] = Event();
    if (b.comm_stage.defined())
      ops::cast(mesh_.ctx(), dp_.compute(), b.comm_stage, b.grad_shard[s]);
    b.comm_stage = Tensor();
    b.launched[s] = false;
    return;
  }
  if (dp_.size() == 1) return;
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

// --- deterministic ---

FixedOrderOps GradSync::fixed_order_ops() const {
  Context& ctx = mesh_.ctx();
  FixedOrderOps o;
  o.allocator = ctx.allocator_ptr();
  o.add = [&ctx](const Tensor& acc, const Tensor& x, Stream& st) {
    ops::add(ctx, st, acc, x, acc);
  };
  return o;
}

Event fixed_order_sum(CommScheduler& dp, const std::vector<Tensor>& blocks, int64_t leaves,
                      const Tensor& out, bool all, const FixedOrderOps& fo) {
  Stream& cs = dp.compute();
  std::vector<int64_t> bounds;
  for (int r = 0; r <= dp.size(); ++r) bounds.push_back(leaves * r / dp.size());
  if (dp.size() == 1) {  // no dp group to name: the same tree, folded here
    FixedOrderStack stack(fo);
    const auto nodes = fixed_order_nodes(0, leaves);
    MESHRT_CHECK(nodes.size() == blocks.size(), "fixed-order sum: " << blocks.size()
                                                                    << " partial sums for "
                                                                    << nodes.size() << " nodes");
    for (size_t k = 0; k < nodes.size(); ++k) stack.push(nodes[k], blocks[k], cs);
    out.copy_(stack.fold(cs), cs);
    return cs.record();
  }
  return all ? fixed_order_all_reduce(dp.group(), blocks, bounds, out, cs, fo)
             : fixed_order_reduce_scatter(dp.group(), blocks, bounds, out, cs, fo);
}

void GradSync::push_grain(int64_t grain) {
  MESHRT_CHECK(opts_.deterministic, "GradSync: push_grain needs DpOptions::deterministic");
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  const size_t s = static_cast<size_t>(active_);
  if (grains_.empty()) {
    for (const Bucket& b : buckets_) {
      MESHRT_CHECK(b.dtype == DType::f32, "data parallel: --deterministic sums f32 gradients; "
                                              << b.params.front()->name << " is "
                                              << dtype_name(b.dtype) << ": train in f32");
      grains_.emplace_back(fixed_order_ops());
    }
  }
  for (const Bucket& b : buckets_) zero_unwritten(b.params);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    // The bucket's buffer itself becomes the grain's leaf (no copy); the next grain's backward
    // writes into a new one. ZeRO 2 / 3: no buffer when no backward wrote this bucket.
    Tensor leaf = b.flat[s].defined() ? b.flat[s] : ctx.zeros({b.padded}, DType::f32);
    grains_[i].push_leaf(grain, leaf, cs);
    renew_flat(b, s);
  }
}

void GradSync::renew_flat(Bucket& b, size_t s) {
  if (opts_.zero >= 2) {  // prepare_grads allocates the next one (zeroed)
    b.flat[s] = Tensor();
    for (Param* q : b.params) q->grad = Tensor();
    return;
  }
  Context& ctx = mesh_.ctx();
  b.flat[s] = ctx.empty({b.padded}, b.dtype);
  // The padding stays zero (it adds nothing to the sums); zero_grad writes the rest.
  if (b.padded > b.numel)
    b.flat[s].narrow(0, b.numel, b.padded - b.numel).zero_(ctx.compute_stream());
  for (size_t i = 0; i < b.params.size(); ++i)
    b.params[i]->grad = b.flat[s].narrow(0, b.offsets[i], b.shapes[i].numel()).view(b.shapes[i]);
}

void GradSync::reduce_grains(int64_t grains) {
  MESHRT_CHECK(grains_.size() == buckets_.size() && !grains_.front().nodes().empty(),
               "GradSync: reduce_grains needs the step's grains (push_grain)");
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  const size_t s = static_cast<size_t>(active_);
  const int p = dp_.size();
  const FixedOrderOps fo = fixed_order_ops();
  const float inv = 1.f / static_cast<float>(grains);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    std::vector<Tensor> blocks;
    for (const auto& nt : grains_[i].nodes()) blocks.push_back(nt.second);
    const int64_t chunk = b.padded / p;
    if (opts_.zero < 2 && !b.flat[s].defined()) allocate_full(b, s);
    const Tensor out =
        opts_.zero >= 2 ? b.grad_shard[s] : b.flat[s].narrow(0, dp_rank() * chunk, chunk);
    fixed_order_sum(dp_, blocks, grains, out, false, fo);
    ops::scale(ctx, cs, out, out, inv);
    if (opts_.zero < 2 && p > 1) dp_.group().all_gather(out, b.flat[s], cs);
    if (opts_.zero >= 2) {
      b.flat[s] = Tensor();
      for (Param* q : b.params) q->grad = Tensor();
    }
    b.launched[s] = false;
    grains_[i].clear();
  }
}

void GradSync::sum_squares_reduced(const Tensor& out) {
  const size_t s = static_cast<size_t>(active_);
  for (const Bucket& b : buckets_)
    ops::sum_squares(mesh_.ctx(), mesh_.ctx().compute_stream(),
                     opts_.zero >= 2 ? b.grad_shard[s] : b.flat[s], out);
}

}  // namespace meshrt
