#include "dist/parallel.h"

#include <chrono>

#include "runtime/error.h"

namespace meshrt {

bool Param::sharded_on(const DeviceMesh& mesh, std::string_view dim) const {
  return mesh.has_dim(dim) && placements[static_cast<size_t>(mesh.dim_index(dim))].is_shard();
}

std::vector<Placement> placements_on(const DeviceMesh& mesh, std::string_view dim, Placement p) {
  std::vector<Placement> pl(static_cast<size_t>(mesh.ndim()), Placement::replicate());
  if (mesh.has_dim(dim)) pl[static_cast<size_t>(mesh.dim_index(dim))] = p;
  return pl;
}

namespace {

Param alloc_param(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                  std::vector<Placement> pl, DType dtype) {
  Param p;
  p.name = std::move(name);
  p.id = id;
  p.full_shape = full;
  Shape local;
  shard_extent(full, mesh, pl, &local, &p.offsets);
  p.placements = std::move(pl);
  p.value = mesh.ctx().empty(local, dtype);
  p.grad = mesh.ctx().zeros(local, dtype);
  return p;
}

}  // namespace

Param make_param(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                 std::vector<Placement> pl, DType dtype, const PhiloxInit& init) {
  Param p = alloc_param(mesh, std::move(name), id, full, std::move(pl), dtype);
  PhiloxInit pi = init;
  pi.id = id;
  p.value.init_philox_(pi, full, p.offsets, mesh.ctx().compute_stream());
  return p;
}

Param make_param_const(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                       std::vector<Placement> pl, DType dtype, double value) {
  Param p = alloc_param(mesh, std::move(name), id, full, std::move(pl), dtype);
  p.value.fill_(value, mesh.ctx().compute_stream());
  return p;
}

// ---- CommScheduler ---------------------------------------------------------------------------

struct CommScheduler::Shared {
  using Pairs = std::vector<std::pair<Event, Event>>;
  std::mutex mu;
  CommTimes t;
  // Event pairs whose elapsed time is still to be added (resolved outside stream callbacks,
  // which must not call CUDA): collectives on the comm stream, CUDA compute-stream waits.
  Pairs comm_pending, exposed_pending;

  void add_pending(Pairs Shared::*which, Event a, Event b) {
    std::lock_guard<std::mutex> lk(mu);
    (this->*which).emplace_back(std::move(a), std::move(b));
    // Resolve what has completed so long runs do not accumulate pairs.
    resolve_locked(false);
  }
  void resolve_locked(bool block) {
    auto drain = [&](Pairs& v, double& acc) {
      size_t keep = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        auto& [a, b] = v[i];
        if (!block && !b.query()) {
          v[keep++] = std::move(v[i]);
          continue;
        }
        try {
          b.synchronize();
          acc += b.elapsed_ms(a);
        } catch (...) {
          // a failed collective reports its error where its result is waited for
        }
      }
      v.resize(keep);
    };
    drain(comm_pending, t.comm_ms);
    drain(exposed_pending, t.exposed_ms);
  }
};

CommScheduler::CommScheduler(DeviceMesh& mesh, std::string_view dim, Overlap overlap)
    : mesh_(mesh),
      dim_(dim),
      overlap_(overlap),
      compute_(mesh.ctx().compute_stream()),
      shared_(std::make_shared<Shared>()) {
  size_ = mesh.size(dim_);
  rank_ = mesh.coord(dim_);
}

Stream& CommScheduler::comm() const { return mesh_.stream(dim_); }
Communicator& CommScheduler::group() const { return mesh_.group(dim_); }

Event CommScheduler::finish(Event done, const Tensor& a, const Tensor& b, int64_t bytes,
                            int64_t CommTimes::*kind) {
  {
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->t.bytes += bytes;
    shared_->t.count++;
    if (kind) shared_->t.*kind += bytes;
  }
  if (a.defined() && !a.device().is_cpu()) a.storage()->record_stream(comm());
  if (b.defined() && !b.device().is_cpu()) b.storage()->record_stream(comm());
  if (overlap_ == Overlap::None) wait(done);
  return done;
}

template <class F>
Event CommScheduler::timed(F&& call) {
  Stream& cs = comm();
  cs.wait(compute_.record());
  Event t0 = cs.record_timed();
  Event done = call(cs);
  Event t1 = cs.record_timed();
  shared_->add_pending(&Shared::comm_pending, t0, t1);
  return done;
}

Event CommScheduler::all_gather(const Tensor& in, const Tensor& out, const char* what) {
  if (size_ == 1) {
    if (in.data_ptr() != out.data_ptr()) out.view(in.shape()).copy_(in, compute_);
    return Event();
  }
  (void)what;
  Event done = timed([&](Stream& cs) { return group().all_gather(in, out, cs); });
  return finish(done, in, out, static_cast<int64_t>(out.nbytes()), &CommTimes::all_gather_bytes);
}

Event CommScheduler::reduce_scatter(const Tensor& in, const Tensor& out, const char* what,
                                    ReduceOp op) {
  if (size_ == 1) {
    if (in.data_ptr() != out.data_ptr()) out.copy_(in.view(out.shape()), compute_);
    return Event();
  }
  (void)what;
  Event done = timed([&](Stream& cs) { return group().reduce_scatter(in, out, op, cs); });
  return finish(done, in, out, static_cast<int64_t>(in.nbytes()), &CommTimes::reduce_scatter_bytes);
}

Event CommScheduler::all_reduce(const Tensor& t, const char* what, ReduceOp op) {
  if (size_ == 1) return Event();
  (void)what;
  Event done = timed([&](Stream& cs) { return group().all_reduce(t, op, cs); });
  return finish(done, t, Tensor(), static_cast<int64_t>(t.nbytes()), &CommTimes::all_reduce_bytes);
}

Event CommScheduler::broadcast(const Tensor& t, int root, const char* what) {
  if (size_ == 1) return Event();
  (void)what;
  Event done = timed([&](Stream& cs) { return group().broadcast(t, root, cs); });
  return finish(done, t, Tensor(), static_cast<int64_t>(t.nbytes()));
}

Event CommScheduler::exchange(const Tensor& in, const Tensor& out, const char* what) {
  if (size_ == 1) {
    if (in.data_ptr() != out.data_ptr()) out.copy_(in, compute_);
    return Event();
  }
  (void)what;
  Event done = timed([&](Stream& cs) { return group().all_to_all(in, out, cs); });
  return finish(done, in, out, static_cast<int64_t>(in.nbytes()), &CommTimes::reduce_scatter_bytes);
}

void CommScheduler::wait(const Event& e) {
  if (!e.valid()) return;
  if (compute_.device().is_cpu()) {
    // The compute worker blocks here; the time it stands is exposed communication.
    auto sh = shared_;
    compute_.enqueue([sh, e] {
      auto t0 = std::chrono::steady_clock::now();
      e.synchronize();
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lk(sh->mu);
      sh->t.exposed_ms += ms;
    });
  } else {
    // The compute stream idles from w0 to w1: the device-side exposed time.
    Event w0 = compute_.record_timed();
    compute_.wait(e);
    Event w1 = compute_.record_timed();
    shared_->add_pending(&Shared::exposed_pending, w0, w1);
  }
}

void CommScheduler::settle_grad_writes() {
  if (!grad_writes_.valid()) return;
  wait(grad_writes_);
  grad_writes_ = Event();
}

CommTimes CommScheduler::times() const {
  std::lock_guard<std::mutex> lk(shared_->mu);
  shared_->resolve_locked(true);
  return shared_->t;
}

void CommScheduler::reset_times() {
  std::lock_guard<std::mutex> lk(shared_->mu);
  shared_->resolve_locked(true);
  shared_->t = CommTimes{};
}

// ---- Redistribution ----------------------------------------------------------------------------

Redistribution Redistribution::grad() const {
  const Placement R = Placement::replicate();
  if (from.is_shard() && to.is_replicate()) return {Placement::partial(), from};
  if (from.is_partial() && to.is_shard()) return {to, R};
  if (from.is_partial() && to.is_replicate()) return {R, R};
  if (from.is_replicate() && to.is_replicate()) return {Placement::partial(), R};
  MESHRT_CHECK(is_identity(), "redistribute: no gradient rule for " << str());
  return *this;
}

Shape Redistribution::out_shape(const Shape& in, int parts) const {
  Shape s = in;
  if (from.is_shard() && to.is_replicate()) s[0] *= parts;
  if (from.is_partial() && to.is_shard()) s[0] /= parts;
  return s;
}

std::string Redistribution::str() const { return from.str() + " -> " + to.str(); }

RedistKind Redistribution::kind() const {
  if (is_identity()) return RedistKind::Copy;
  const bool dim0 = (from.is_shard() && from.dim == 0) || (to.is_shard() && to.dim == 0);
  if (from.is_shard() && to.is_replicate() && dim0) return RedistKind::AllGather;
  if (from.is_partial() && to.is_shard() && dim0) return RedistKind::ReduceScatter;
  if (from.is_partial() && to.is_replicate()) return RedistKind::AllReduce;
  MESHRT_FAIL("redistribute: " << str() << " is not supported (shards of activations are on "
                               << "dim 0, the sequence)");
}

Event redistribute(CommScheduler& c, const Tensor& in, const Tensor& out, const Redistribution& r,
                   const char* what) {
  switch (r.kind()) {
    case RedistKind::AllGather:
      return c.all_gather(in, out, what);
    case RedistKind::ReduceScatter:
      return c.reduce_scatter(in, out, what);
    case RedistKind::AllReduce:
      if (in.data_ptr() != out.data_ptr()) out.copy_(in, c.compute());
      return c.all_reduce(out, what, r.from.op);
    case RedistKind::Copy:
      break;
  }
  if (in.data_ptr() != out.data_ptr()) out.copy_(in, c.compute());
  return Event();
}

}  // namespace meshrt
