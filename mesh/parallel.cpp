#include "mesh/parallel.h"

#include <chrono>

#include "runtime/error.h"

namespace meshrt {

const char* overlap_name(Overlap o) {
  switch (o) {
    case Overlap::None:
      return "none";
    case Overlap::Async:
      return "async";
    case Overlap::Chunked:
      return "chunked";
  }
  return "?";
}

Overlap parse_overlap(std::string_view s) {
  if (s == "none") return Overlap::None;
  if (s == "async") return Overlap::Async;
  if (s == "chunked") return Overlap::Chunked;
  MESHRT_FAIL("unknown overlap mode '" << s << "': use none, async or chunked");
}

std::vector<Placement> Param::placements(const DeviceMesh& mesh) const {
  std::vector<Placement> pl(static_cast<size_t>(mesh.ndim()), Placement::replicate());
  if (tp_shard_dim >= 0 && mesh.has_dim("tp"))
    pl[static_cast<size_t>(mesh.dim_index("tp"))] = Placement::shard(tp_shard_dim);
  return pl;
}

namespace {

Param alloc_param(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                  int shard_dim, DType dtype) {
  Param p;
  p.name = std::move(name);
  p.id = id;
  p.full_shape = full;
  p.tp_shard_dim = shard_dim;
  Shape local = full, off = full;
  for (int i = 0; i < off.ndim(); ++i) off[i] = 0;
  if (shard_dim >= 0) {
    int tp = mesh.size("tp");
    MESHRT_CHECK(full[shard_dim] % tp == 0,
                 "parameter " << p.name << " " << full.str() << ": dim " << shard_dim << " of size "
                              << full[shard_dim] << " does not divide by tp=" << tp);
    local[shard_dim] = full[shard_dim] / tp;
    off[shard_dim] = mesh.coord("tp") * local[shard_dim];
  }
  p.offsets = off;
  p.value = mesh.ctx().empty(local, dtype);
  p.grad = mesh.ctx().zeros(local, dtype);
  return p;
}

}  // namespace

Param make_param(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                 int shard_dim, DType dtype, const PhiloxInit& init) {
  Param p = alloc_param(mesh, std::move(name), id, full, shard_dim, dtype);
  PhiloxInit pi = init;
  pi.id = id;
  p.value.init_philox_(pi, full, p.offsets, mesh.ctx().compute_stream());
  return p;
}

Param make_param_const(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                       int shard_dim, DType dtype, double value) {
  Param p = alloc_param(mesh, std::move(name), id, full, shard_dim, dtype);
  p.value.fill_(value, mesh.ctx().compute_stream());
  return p;
}

// ---- CommScheduler ---------------------------------------------------------------------------

struct CommScheduler::Shared {
  std::mutex mu;
  CommTimes t;
};

CommScheduler::CommScheduler(DeviceMesh& mesh, std::string dim, Overlap overlap)
    : mesh_(mesh),
      dim_(std::move(dim)),
      overlap_(overlap),
      compute_(mesh.ctx().compute_stream()),
      shared_(std::make_shared<Shared>()) {
  size_ = mesh.size(dim_);
  rank_ = mesh.coord(dim_);
}

Stream& CommScheduler::comm() const { return mesh_.stream(dim_); }
Communicator& CommScheduler::group() const { return mesh_.group(dim_); }

Event CommScheduler::finish(Event done, const Tensor& a, const Tensor& b, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->t.bytes += bytes;
    shared_->t.count++;
  }
  if (a.defined() && !a.device().is_cpu()) a.storage()->record_stream(comm());
  if (b.defined() && !b.device().is_cpu()) b.storage()->record_stream(comm());
  if (overlap_ == Overlap::None) wait(done);
  return done;
}

#define MESHRT_TIMED_COLLECTIVE(call)         \
  Stream& cs = comm();                        \
  Event ready = compute_.record();            \
  cs.wait(ready);                             \
  Event t0 = cs.record();                     \
  Event done = (call);                        \
  Event t1 = cs.record();                     \
  {                                           \
    auto sh = shared_;                        \
    cs.enqueue([sh, t0, t1] {                 \
      float ms = 0;                           \
      try {                                   \
        ms = t1.elapsed_ms(t0);               \
      } catch (...) {                         \
      }                                       \
      std::lock_guard<std::mutex> lk(sh->mu); \
      sh->t.comm_ms += ms;                    \
    });                                       \
  }

Event CommScheduler::all_gather(const Tensor& in, const Tensor& out, const char* what) {
  if (size_ == 1) {
    if (in.data_ptr() != out.data_ptr()) out.view(in.shape()).copy_(in, compute_);
    return Event();
  }
  MESHRT_TIMED_COLLECTIVE(group().all_gather(in, out, cs));
  (void)what;
  return finish(done, in, out, static_cast<int64_t>(out.nbytes()));
}

Event CommScheduler::reduce_scatter(const Tensor& in, const Tensor& out, const char* what) {
  if (size_ == 1) {
    if (in.data_ptr() != out.data_ptr()) out.copy_(in.view(out.shape()), compute_);
    return Event();
  }
  MESHRT_TIMED_COLLECTIVE(group().reduce_scatter(in, out, ReduceOp::Sum, cs));
  (void)what;
  return finish(done, in, out, static_cast<int64_t>(in.nbytes()));
}

Event CommScheduler::all_reduce(const Tensor& t, const char* what, ReduceOp op) {
  if (size_ == 1) return Event();
  MESHRT_TIMED_COLLECTIVE(group().all_reduce(t, op, cs));
  (void)what;
  return finish(done, t, Tensor(), static_cast<int64_t>(t.nbytes()));
}

Event CommScheduler::broadcast(const Tensor& t, int root, const char* what) {
  if (size_ == 1) return Event();
  MESHRT_TIMED_COLLECTIVE(group().broadcast(t, root, cs));
  (void)what;
  return finish(done, t, Tensor(), static_cast<int64_t>(t.nbytes()));
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
    compute_.wait(e);
  }
}

CommTimes CommScheduler::times() const {
  std::lock_guard<std::mutex> lk(shared_->mu);
  return shared_->t;
}

void CommScheduler::reset_times() {
  std::lock_guard<std::mutex> lk(shared_->mu);
  shared_->t = CommTimes{};
}

}  // namespace meshrt
