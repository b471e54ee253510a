// The CUDA DeviceBackend: cudaStream_t / cudaEvent_t wrappers, the caching allocator over
// cudaMalloc, copies, and the kernels of cuda_tensor_ops.cu. Links only the shared CUDA runtime,
// so a CUDA-enabled build starts on a machine without a driver and says why CUDA is unusable.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "runtime/caching_allocator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace cuda_detail {

namespace {

// Makes `device` current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MESHRT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) {
      MESHRT_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  // For destructors and teardown: never throws; ok() says whether `device` is current.
  DeviceGuard(int device, std::nothrow_t) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      ok_ = false;
      return;
    }
    if (prev_ != device) {
      if (cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        ok_ = false;
        return;
      }
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_ && cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  bool ok() const { return ok_; }

 private:
  int prev_ = 0;
  bool switched_ = false;
  bool ok_ = true;
};

// Reports a failure in a destructor or teardown path, where throwing is not an option. Calls made
// while the process exits (the runtime already unloading) are expected to fail and stay quiet.
void warn_cuda(const char* what, cudaError_t err) {
  (void)cudaGetLastError();
  if (err == cudaErrorCudartUnloading) return;
  MESHRT_LOG_WARN(what << " failed: " << cuda_error_text(err));
}

std::string cuda_version_str(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// What the CUDA runtime says about this machine, asked once: the device count does not change
// during a process (CUDA_VISIBLE_DEVICES is read when the runtime initialises).
struct Probe {
  int count = 0;
  std::string why;  // when count == 0
  int runtime_version = 0;
  int driver_version = 0;  // the CUDA version the driver supports; 0 when no driver was found
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    if (cudaRuntimeGetVersion(&r.runtime_version) != cudaSuccess) (void)cudaGetLastError();
    if (cudaDriverGetVersion(&r.driver_version) != cudaSuccess) {
      (void)cudaGetLastError();
      r.driver_version = 0;
    }
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
      r.why = "cudaGetDeviceCount failed: " + cuda_error_text(err);
      if (r.driver_version == 0)
        r.why += "; no NVIDIA driver was found (libcuda is not installed or not loadable)";
      else if (r.driver_version < r.runtime_version)
        r.why += "; the driver supports CUDA " + cuda_version_str(r.driver_version) +
                 " but meshrt was built with CUDA runtime " + cuda_version_str(r.runtime_version) +
                 ": update the NVIDIA driver";
    } else if (n <= 0) {
      n = 0;
      r.why = "no CUDA device (cudaGetDeviceCount returned 0)";
    }
    if (n == 0) {
      if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES"))
        r.why += std::string("; CUDA_VISIBLE_DEVICES=\"") + vis + "\"";
    }
    r.count = n;
    return r;
  }();
  return p;
}

void check_device(int device, const char* what) {
  const Probe& p = probe();
  MESHRT_CHECK(p.count > 0, what << " on cuda:" << device << ": CUDA is unavailable: " << p.why);
  MESHRT_CHECK(device >= 0 && device < p.count, what << " on cuda:" << device
                                                     << ": no such device (" << p.count
                                                     << " CUDA device(s) visible)");
}

class CudaEventImpl;

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

class CudaEventImpl final : public Event::Impl {
 public:
  // Takes ownership of `ev`. Work with sequence numbers in (low, high] of the stream owning `log`
  // precedes the event.
  CudaEventImpl(cudaEvent_t ev, std::shared_ptr<ErrorLog> log, uint64_t low, uint64_t high)
      : ev_(ev), log_(std::move(log)), low_(low), high_(high) {}
  ~CudaEventImpl() override {
    const cudaError_t err = cudaEventDestroy(ev_);
    if (err != cudaSuccess) warn_cuda("cudaEventDestroy", err);
  }
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
  float elapsed_ms_since(const Impl& start) const override {
    auto* s = dynamic_cast<const CudaEventImpl*>(&start);
    MESHRT_CHECK(s != nullptr,
                 "Event::elapsed_ms: start event is not a CUDA event (events of "
                 "host and CUDA streams cannot be timed against each other)");
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
  DeviceType device_type() const override { return DeviceType::CUDA; }
  cudaEvent_t handle() const { return ev_; }
  const ErrorLog* log() const { return log_.get(); }
  // The error carried by the work before this event; call once the event completed.
  std::exception_ptr error() const { return log_ ? log_->find(low_, high_) : nullptr; }

 private:
  cudaEvent_t ev_;
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
    thread_ = std::thread([this] { run(); });
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
  void add(std::shared_ptr<Event::Impl> ev, uint64_t seq, cudaStream_t stream) {
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
    std::shared_ptr<Event::Impl> ev;
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
  std::mutex retired_mu;
  std::vector<HostTask*> retired;
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

  // Called by allocators while they hold their lock: must not destroy retired tasks (which may
  // free memory into the same allocator).
  Event record() override {
    DeviceGuard g(device_);
    cudaEvent_t ev = nullptr;
    MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDefault));  // timing enabled
    std::shared_ptr<CudaEventImpl> impl;
    std::lock_guard<std::mutex> lk(launch_mu_);
    try {
      impl = std::make_shared<CudaEventImpl>(ev, state_->log, state_->log->reported(), seq_);
    } catch (...) {
      (void)cudaEventDestroy(ev);
      throw;
    }
    MESHRT_CUDA_CHECK(cudaEventRecord(ev, stream_));
    return Event(std::move(impl));
  }

  void wait(const Event& e) override {
    if (!e.valid()) return;
    drain_retired();
    state_->log->resolve_completed();
    std::shared_ptr<Event::Impl> impl = e.shared_impl();
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
  void drain_retired() {
    std::vector<HostTask*> done;
    {
      std::lock_guard<std::mutex> lk(state_->retired_mu);
      done.swap(state_->retired);
    }
    for (HostTask* t : done) delete t;
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

// The CUDA device that owns `p` (for work run from a host stream, which has no device).
int device_of_pointer(const void* p, const char* what) {
  cudaPointerAttributes attr{};
  MESHRT_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  MESHRT_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
               what << ": " << p << " is not CUDA device memory");
  return attr.device;
}

// Runs `launch(cudaStream_t)` in the order of stream `s`. On a CUDA stream it is issued right
// away with the stream's device current. On a host stream it runs as one of that stream's tasks
// on `device`'s per-thread default stream, and the task waits for it, so the host stream's order
// holds.
void run_on(Stream& s, int device, const std::function<void(cudaStream_t)>& launch) {
  if (s.device().is_cuda()) {
    DeviceGuard g(s.device().index);
    launch(static_cast<cudaStream_t>(s.native_handle()));
    return;
  }
  s.enqueue([device, launch] {
    DeviceGuard g(device);
    launch(cudaStreamPerThread);
    MESHRT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  });
}

std::string describe_free_memory(int device) {
  DeviceGuard g(device, std::nothrow);
  size_t free_b = 0, total_b = 0;
  const cudaError_t err = g.ok() ? cudaMemGetInfo(&free_b, &total_b) : cudaErrorInvalidDevice;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaMemGetInfo failed: " + cuda_error_text(err);
  }
  std::ostringstream os;
  os << "cuda:" << device << " has " << (free_b >> 20) << " MiB free of " << (total_b >> 20)
     << " MiB";
  return os.str();
}

class CudaBackend final : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }

  int device_count(std::string* why) const override {
    const Probe& p = probe();
    if (p.count == 0 && why) *why = p.why;
    return p.count;
  }

  std::unique_ptr<Stream> create_stream(int device, std::string name) const override {
    check_device(device, "create_stream");
    DeviceGuard g(device);
    cudaStream_t s = nullptr;
    MESHRT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    try {
      return std::make_unique<CudaStream>(device, s, /*owned=*/true, std::move(name));
    } catch (...) {
      (void)cudaStreamDestroy(s);
      throw;
    }
  }

  std::unique_ptr<Stream> wrap_stream(int device, void* native, std::string name) const override {
    check_device(device, "wrap_stream");
    // A null handle is the legacy default stream; name it explicitly so native_handle() of a
    // CUDA stream is never null (null means "host stream").
    cudaStream_t s = native ? static_cast<cudaStream_t>(native) : cudaStreamLegacy;
#if CUDART_VERSION >= 12080
    if (native) {
      int owner = -1;
      const cudaError_t err = cudaStreamGetDevice(s, &owner);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        MESHRT_FAIL("wrap_stream('" << name << "'): " << native
                                    << " is not a valid cudaStream_t: " << cuda_error_text(err));
      }
      MESHRT_CHECK(owner == device, "wrap_stream('" << name << "'): the stream belongs to cuda:"
                                                    << owner << ", not cuda:" << device);
    }
#endif
    return std::make_unique<CudaStream>(device, s, /*owned=*/false, std::move(name));
  }

  std::shared_ptr<Allocator> create_caching_allocator(int device) const override {
    check_device(device, "create_caching_allocator");
    CachingAllocator::Raw raw;
    raw.alloc = [device](size_t bytes) -> void* {
      DeviceGuard g(device);
      void* p = nullptr;
      const cudaError_t err = cudaMalloc(&p, bytes);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // out of memory is not sticky: the caller may free and retry
        return nullptr;
      }
      MESHRT_CUDA_CHECK(err);
      return p;
    };
    raw.free = [device](void* p) {  // runs in destructors: never throws
      DeviceGuard g(device, std::nothrow);
      const cudaError_t err = cudaFree(p);
      if (err != cudaSuccess) warn_cuda("cudaFree", err);
    };
    raw.describe_free = [device] { return describe_free_memory(device); };
    return std::make_shared<CachingAllocator>(Device::cuda(device), "cuda-caching", std::move(raw));
  }

  void memcpy_async(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes,
                    Stream& s) const override {
    MESHRT_CHECK(dst_dev.is_cuda() || src_dev.is_cuda(),
                 "CUDA memcpy_async between " << src_dev.str() << " and " << dst_dev.str());
    if (bytes == 0) return;
    const int device = s.device().is_cuda() ? s.device().index
                                            : (dst_dev.is_cuda() ? dst_dev.index : src_dev.index);
    if (dst_dev.is_cuda() && src_dev.is_cuda() && dst_dev.index != src_dev.index) {
      run_on(s, device, [=](cudaStream_t cs) {
        MESHRT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, bytes, cs));
      });
      return;
    }
    const cudaMemcpyKind kind =
        dst_dev.is_cuda() ? (src_dev.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                          : cudaMemcpyDeviceToHost;
    run_on(s, device,
           [=](cudaStream_t cs) { MESHRT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cs)); });
  }

  void copy_strided(const TensorDesc& dst, const TensorDesc& src, Stream& s) const override {
    const int device =
        s.device().is_cuda() ? s.device().index : device_of_pointer(dst.ptr, "CUDA copy_strided");
    run_on(s, device, [dst, src](cudaStream_t cs) { launch_copy_strided(dst, src, cs); });
  }

  void fill(const TensorDesc& dst, double value, Stream& s) const override {
    const int device =
        s.device().is_cuda() ? s.device().index : device_of_pointer(dst.ptr, "CUDA fill");
    run_on(s, device, [dst, value](cudaStream_t cs) { launch_fill(dst, value, cs); });
  }

  void init_philox(const TensorDesc& dst, const PhiloxInit& init, const Shape& full_shape,
                   const Shape& offsets, Stream& s) const override {
    const int device =
        s.device().is_cuda() ? s.device().index : device_of_pointer(dst.ptr, "CUDA init_philox");
    run_on(s, device, [dst, init, full_shape, offsets](cudaStream_t cs) {
      launch_init_philox(dst, init, full_shape, offsets, cs);
    });
  }

  std::string versions() const override {
    const Probe& p = probe();
    std::ostringstream os;
    os << "CUDA runtime " << cuda_version_str(p.runtime_version);
    if (p.driver_version > 0)
      os << ", driver for CUDA " << cuda_version_str(p.driver_version);
    else
      os << ", no CUDA driver";
    if (p.count == 0) {
      os << "; no usable GPU: " << p.why;
      return os.str();
    }
    for (int i = 0; i < p.count; ++i) {
      cudaDeviceProp prop{};
      const cudaError_t err = cudaGetDeviceProperties(&prop, i);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        os << "; cuda:" << i << " (" << cuda_error_text(err) << ")";
        continue;
      }
      os << "; cuda:" << i << " " << prop.name << " (sm_" << prop.major << prop.minor << ", "
         << prop.multiProcessorCount << " SMs, " << (prop.totalGlobalMem >> 20) << " MiB)";
    }
    return os.str();
  }
};

}  // namespace

}  // namespace cuda_detail

const DeviceBackend* cuda_backend() {
  static const cuda_detail::CudaBackend be;
  return &be;
}

}  // namespace meshrt
