// CUDA streams and events: cudaStream_t / cudaEvent_t wrappers that carry the errors of host work
// (enqueued functions, waited-for host events) in stream order, as host streams do.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/cuda_device.h"
#include "backends/cuda/runtime/cuda_ops.h"
#include "backends/cuda/runtime/cuda_stream.h"
#include "backends/cuda/runtime/device_guard.h"
#include "runtime/error.h"
#include "runtime/event_impl.h"
#include "runtime/event_pool.h"
#include "runtime/thread.h"

namespace meshrt::cuda_detail {

namespace {

class CudaEventImpl;

using EventPool = HandlePool<cudaEvent_t>;

// Events of one kind (timing or not); created on the stream's device when the pool is empty.
std::shared_ptr<EventPool> make_event_pool(bool timing) {
  return std::make_shared<EventPool>(
      [timing] {
        cudaEvent_t ev = nullptr;
        MESHRT_CUDA_CHECK(
            cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming));
        return ev;
      },
      [](cudaEvent_t ev) {
        const cudaError_t err = cudaEventDestroy(ev);
        if (err != cudaSuccess) warn_cuda("cudaEventDestroy", err);
      });
}

// Errors raised by host work on a CUDA stream (enqueued functions, waited-for host events, and the
// errors carried by CUDA events of other streams it waited for), each tagged with the stream
// sequence number of that work, so an event reports exactly the errors of the work recorded
// before it and synchronize() reports each error once.
class ErrorLog {
 public:
  void capture(uint64_t seq, std::exception_ptr e);
  // Stream waited (under `seq`) for `ev` of another stream: its error, if any, becomes ours. Only
  // known once `ev` completed, so the link is resolved later (see resolve()).
  void link(uint64_t seq, std::shared_ptr<CudaEventImpl> ev);
  // The first error of work in (low, high]. Call only once that work has completed.
  std::exception_ptr find(uint64_t low, uint64_t high);
  uint64_t reported() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reported_;
  }
  // The first unreported error of work up to `high` (completed); everything up to `high` counts
  // as reported afterwards.
  std::exception_ptr take(uint64_t high);
  // Resolves links whose events completed, so they do not pile up between synchronizes.
  void resolve_completed();

 private:
  struct Link {
    uint64_t seq;
    std::shared_ptr<CudaEventImpl> ev;
  };
  // Resolves the links with seq <= high (their events have completed).
  void resolve_upto(uint64_t high);
  std::exception_ptr first_locked(uint64_t low, uint64_t high) const;

  static constexpr size_t kKeep = 16;
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, std::exception_ptr>> errors_;  // sorted by seq
  std::vector<Link> links_;
  uint64_t reported_ = 0;
};

class CudaEventImpl final : public EventImpl {
 public:
  // Holds `ev` (from `pool`, which gets it back). Work with sequence numbers in (low, high] of
  // the stream owning `log` precedes the event.
  CudaEventImpl(cudaEvent_t ev, std::shared_ptr<EventPool> pool, bool timing,
                std::shared_ptr<ErrorLog> log, uint64_t low, uint64_t high)
      : ev_(ev),
        pool_(std::move(pool)),
        timing_(timing),
        log_(std::move(log)),
        low_(low),
        high_(high) {}
  ~CudaEventImpl() override { pool_->release(ev_); }
  CudaEventImpl(const CudaEventImpl&) = delete;
  CudaEventImpl& operator=(const CudaEventImpl&) = delete;

  void synchronize() override {
    MESHRT_CUDA_CHECK(cudaEventSynchronize(ev_));
    if (auto e = error()) std::rethrow_exception(e);
  }
  bool query() override {
    const cudaError_t r = cudaEventQuery(ev_);
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is no error; keep it away from launch checks
      return false;
    }
    MESHRT_CUDA_CHECK(r);
    return false;
  }
  float elapsed_ms_since(const EventImpl& start) const override {
    auto* s = dynamic_cast<const CudaEventImpl*>(&start);
    MESHRT_CHECK(s != nullptr,
                 "Event::elapsed_ms: start event is not a CUDA event (events of "
                 "host and CUDA streams cannot be timed against each other)");
    MESHRT_CHECK(timing_ && s->timing_,
                 "Event::elapsed_ms: CUDA events to time must come from Stream::record_timed() "
                 "(record() makes timing-free events)");
    float ms = 0.f;
    const cudaError_t r = cudaEventElapsedTime(&ms, s->ev_, ev_);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      MESHRT_FAIL(
          "Event::elapsed_ms: both events must have completed (synchronize the later one "
          "first)");
    }
    MESHRT_CUDA_CHECK(r);
    return ms;
  }
  cudaEvent_t handle() const { return ev_; }
  const ErrorLog* log() const { return log_.get(); }
  // The error carried by the work before this event; call once the event completed.
  std::exception_ptr error() const { return log_ ? log_->find(low_, high_) : nullptr; }

 private:
  cudaEvent_t ev_;
  std::shared_ptr<EventPool> pool_;
  bool timing_;
  std::shared_ptr<ErrorLog> log_;
  uint64_t low_, high_;
};

void ErrorLog::capture(uint64_t seq, std::exception_ptr e) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = std::upper_bound(errors_.begin(), errors_.end(), seq,
                             [](uint64_t s, const auto& entry) { return s < entry.first; });
  errors_.insert(it, {seq, std::move(e)});
  // Keeps the earliest: the first error is the one reported, later ones are its consequences.
  if (errors_.size() > kKeep) errors_.pop_back();
}

void ErrorLog::link(uint64_t seq, std::shared_ptr<CudaEventImpl> ev) {
  std::lock_guard<std::mutex> lk(mu_);
  links_.push_back({seq, std::move(ev)});
}

std::exception_ptr ErrorLog::first_locked(uint64_t low, uint64_t high) const {
  for (auto& [seq, e] : errors_)
    if (seq > low && seq <= high) return e;
  return nullptr;
}

void ErrorLog::resolve_upto(uint64_t high) {
  std::vector<Link> ready;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto keep = std::partition(links_.begin(), links_.end(),
                               [high](const Link& l) { return l.seq > high; });
    std::move(keep, links_.end(), std::back_inserter(ready));
    links_.erase(keep, links_.end());
  }
  // Outside our lock: the other stream's log takes its own (two streams may wait on each other).
  for (auto& l : ready)
    if (auto e = l.ev->error()) capture(l.seq, e);
}

void ErrorLog::resolve_completed() {
  std::vector<Link> pending;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (links_.empty()) return;
    pending.swap(links_);
  }
  std::vector<Link> still;
  for (auto& l : pending) {
    bool done = false;
    try {
      done = l.ev->query();
    } catch (...) {
      done = false;  // a broken context reports itself at the next synchronize
    }
    if (!done) {
      still.push_back(std::move(l));
      continue;
    }
    if (auto e = l.ev->error()) capture(l.seq, e);
  }
  std::lock_guard<std::mutex> lk(mu_);
  links_.insert(links_.end(), std::make_move_iterator(still.begin()),
                std::make_move_iterator(still.end()));
}

std::exception_ptr ErrorLog::find(uint64_t low, uint64_t high) {
  resolve_upto(high);
  std::lock_guard<std::mutex> lk(mu_);
  return first_locked(low, high);
}

std::exception_ptr ErrorLog::take(uint64_t high) {
  resolve_upto(high);
  std::lock_guard<std::mutex> lk(mu_);
  std::exception_ptr out = first_locked(reported_, high);
  reported_ = std::max(reported_, high);
  return out;
}

// Holds a CUDA stream until host events complete without blocking CUDA's host-function thread.
// A host function that blocks on a host event would stall the host functions of every stream (the
// driver may run them on one thread), and CUDA forbids host functions that wait on work that is
// not ordered before them. Instead the stream runs a one-thread kernel polling a counter in mapped
// host memory, and a waiter thread raises the counter as the host events complete, in the
// stream's order.
class HostGate {
 public:
  HostGate(int device, std::shared_ptr<ErrorLog> log) : log_(std::move(log)) {
    DeviceGuard g(device);
    void* p = nullptr;
    MESHRT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(uint64_t), cudaHostAllocMapped));
    host_ = static_cast<uint64_t*>(p);
    std::atomic_ref<uint64_t>(*host_).store(0, std::memory_order_relaxed);
    void* d = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
    if (err != cudaSuccess) {
      (void)cudaFreeHost(p);
      MESHRT_CUDA_CHECK(err);
    }
    dev_ = static_cast<const volatile uint64_t*>(d);
    try {
      thread_ = start_thread([this] { run(); }, "the host-event thread of a CUDA stream",
                             "raise ulimit -u / ulimit -v");
    } catch (...) {
      (void)cudaFreeHost(p);
      throw;
    }
  }
  ~HostGate() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // returns once every queued host event completed
    const cudaError_t err = cudaFreeHost(host_);
    if (err != cudaSuccess) warn_cuda("cudaFreeHost (host gate)", err);
  }
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  // Work enqueued on `stream` after this call starts once `ev` completed. An error carried by
  // `ev` is logged under `seq`. The caller serialises calls for one stream.
  void add(std::shared_ptr<EventImpl> ev, uint64_t seq, cudaStream_t stream) {
    const uint64_t ticket = issued_ + 1;
    launch_host_gate(dev_, ticket, stream);
    issued_ = ticket;
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(Item{std::move(ev), seq, ticket});
    }
    cv_.notify_one();
  }

 private:
  struct Item {
    std::shared_ptr<EventImpl> ev;
    uint64_t seq = 0;
    uint64_t ticket = 0;
  };

  void run() {
    for (;;) {
      Item it;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;  // stopped and drained
        it = std::move(q_.front());
        q_.pop_front();
      }
      try {
        it.ev->synchronize();
      } catch (...) {
        log_->capture(it.seq, std::current_exception());
      }
      it.ev.reset();
      std::atomic_ref<uint64_t>(*host_).store(it.ticket, std::memory_order_release);
    }
  }

  std::shared_ptr<ErrorLog> log_;
  uint64_t* host_ = nullptr;
  const volatile uint64_t* dev_ = nullptr;
  uint64_t issued_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  bool stop_ = false;
  std::thread thread_;
};

struct StreamState;

// One function enqueued on a CUDA stream. Its captures (tensors, events) are destroyed after it
// ran, but not inside CUDA's host-function callback: destroying them may free memory and record
// events, i.e. call CUDA, which callbacks must not do. Finished tasks are "retired" and destroyed
// by the next call into the stream from an ordinary thread.
struct HostTask {
  std::function<void()> fn;
  uint64_t seq = 0;
  std::shared_ptr<StreamState> state;
};

struct StreamState {
  std::shared_ptr<ErrorLog> log = std::make_shared<ErrorLog>();
  // Recorded events come back here when dropped: recording (on every allocator free, every
  // collective) creates no CUDA event once the pools are warm.
  std::shared_ptr<EventPool> events = make_event_pool(false);
  std::shared_ptr<EventPool> timed_events = make_event_pool(true);
  std::mutex retired_mu;
  std::vector<HostTask*> retired;
  // hold_until_done: owners behind the event after the work they outlive, in stream order.
  std::mutex held_mu;
  std::deque<std::pair<Event, std::shared_ptr<const void>>> held;
};

void CUDART_CB run_host_task(void* arg) {
  auto* t = static_cast<HostTask*>(arg);
  try {
    t->fn();
  } catch (...) {
    t->state->log->capture(t->seq, std::current_exception());
  }
  try {
    std::shared_ptr<StreamState> st = t->state;
    std::lock_guard<std::mutex> lk(st->retired_mu);
    st->retired.push_back(t);
  } catch (...) {
    // out of memory while retiring: the task leaks rather than being destroyed here
  }
}

class CudaStream final : public Stream {
 public:
  CudaStream(int device, cudaStream_t stream, bool owned, std::string name)
      : device_(device), stream_(stream), owned_(owned), name_(std::move(name)) {}

  ~CudaStream() override {
    bool drained = false;
    {
      DeviceGuard g(device_, std::nothrow);
      const cudaError_t err = cudaStreamSynchronize(stream_);
      if (err == cudaSuccess)
        drained = true;
      else
        warn_cuda(("cudaStreamSynchronize in ~Stream('" + name_ + "')").c_str(), err);
    }
    // Destroying retired captures may free tensors, whose allocator records an event on this
    // stream: it still exists here.
    drain_retired();
    if (drained) {
      // Linked events of other streams have completed: resolving them also breaks the reference
      // cycle that two streams waiting on each other would otherwise leave behind.
      state_->log->resolve_completed();
      gate_.reset();
    } else {
      (void)gate_.release();  // its waiter may still be blocked on a host event: leak it
    }
    if (owned_) {
      DeviceGuard g(device_, std::nothrow);
      const cudaError_t err = cudaStreamDestroy(stream_);
      if (err != cudaSuccess) warn_cuda("cudaStreamDestroy", err);
    }
  }

  Device device() const override { return Device::cuda(device_); }
  void* native_handle() const override { return static_cast<void*>(stream_); }
  std::string name() const override { return name_; }

  void enqueue(std::function<void()> fn) override {
    drain_retired();
    auto task = std::make_unique<HostTask>();
    task->fn = std::move(fn);
    task->state = state_;
    DeviceGuard g(device_);
    std::lock_guard<std::mutex> lk(launch_mu_);
    task->seq = ++seq_;
    MESHRT_CUDA_CHECK(cudaLaunchHostFunc(stream_, &run_host_task, task.get()));
    (void)task.release();  // run_host_task retires it
  }

  void hold_until_done(std::shared_ptr<const void> owner) override {
    if (!owner) return;
    drain_retired();
    Event done = record();
    std::lock_guard<std::mutex> lk(state_->held_mu);
    state_->held.emplace_back(std::move(done), std::move(owner));
  }

  // Called by allocators while they hold their lock: must not destroy retired tasks (which may
  // free memory into the same allocator).
  Event record() override { return record_from(state_->events, false); }
  Event record_timed() override { return record_from(state_->timed_events, true); }

  void wait(const Event& e) override {
    if (!e.valid()) return;
    drain_retired();
    state_->log->resolve_completed();
    std::shared_ptr<EventImpl> impl = EventAccess::impl(e);
    if (auto ce = std::dynamic_pointer_cast<CudaEventImpl>(impl)) {
      DeviceGuard g(device_);
      std::lock_guard<std::mutex> lk(launch_mu_);
      MESHRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ce->handle(), 0));
      // The other stream's errors before `ce` become errors of this stream's later work, as
      // with host streams.
      if (ce->log() != state_->log.get()) state_->log->link(++seq_, std::move(ce));
      return;
    }
    // A host event (or another implementation's): only its completion and its error matter.
    if (impl->query()) {
      try {
        impl->synchronize();
      } catch (...) {
        std::lock_guard<std::mutex> lk(launch_mu_);
        state_->log->capture(++seq_, std::current_exception());
      }
      return;
    }
    DeviceGuard g(device_);
    std::lock_guard<std::mutex> lk(launch_mu_);
    if (!gate_) gate_ = std::make_unique<HostGate>(device_, state_->log);
    gate_->add(std::move(impl), seq_ + 1, stream_);
    ++seq_;
  }

  void synchronize() override {
    uint64_t upto;
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      upto = seq_;
    }
    {
      DeviceGuard g(device_);
      MESHRT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    drain_retired();
    if (auto e = state_->log->take(upto)) std::rethrow_exception(e);
  }

 private:
  Event record_from(const std::shared_ptr<EventPool>& pool, bool timing) {
    DeviceGuard g(device_);
    cudaEvent_t ev = pool->acquire();
    std::shared_ptr<CudaEventImpl> impl;
    std::lock_guard<std::mutex> lk(launch_mu_);
    try {
      impl = std::make_shared<CudaEventImpl>(ev, pool, timing, state_->log, state_->log->reported(),
                                             seq_);
    } catch (...) {
      pool->release(ev);
      throw;
    }
    MESHRT_CUDA_CHECK(cudaEventRecord(ev, stream_));
    return EventAccess::wrap(std::move(impl));
  }

  void drain_retired() {
    std::vector<HostTask*> done;
    {
      std::lock_guard<std::mutex> lk(state_->retired_mu);
      done.swap(state_->retired);
    }
    for (HostTask* t : done) delete t;
    // Owners whose event completed, front first (events of one stream complete in order). They
    // are dropped outside the lock: freeing memory records events on this stream.
    std::vector<std::shared_ptr<const void>> free;
    {
      std::lock_guard<std::mutex> lk(state_->held_mu);
      while (!state_->held.empty()) {
        bool complete = true;
        try {
          complete = state_->held.front().first.query();
        } catch (...) {
          // the stream failed: its error surfaces where it is synchronised; release the owner
        }
        if (!complete) break;
        free.push_back(std::move(state_->held.front().second));
        state_->held.pop_front();
      }
    }
  }

  int device_;
  cudaStream_t stream_;
  bool owned_;
  std::string name_;
  std::shared_ptr<StreamState> state_ = std::make_shared<StreamState>();
  std::mutex launch_mu_;  // orders sequence numbers with the launches they tag
  uint64_t seq_ = 0;      // sequence number of the last host work enqueued
  std::unique_ptr<HostGate> gate_;
};

}  // namespace

std::unique_ptr<Stream> make_cuda_stream(int device, cudaStream_t stream, bool owned,
                                         std::string name) {
  return std::make_unique<CudaStream>(device, stream, owned, std::move(name));
}

}  // namespace meshrt::cuda_detail
