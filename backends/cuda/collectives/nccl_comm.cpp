#include "collectives/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "backends/cuda/collectives/nccl_check.h"
#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/device_guard.h"
#include "collectives/backend_registry.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/comm_impl.h"
#include "collectives/poll_thread.h"
#include "runtime/backend.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/tensor.h"

namespace meshrt {

namespace detail {

[[noreturn]] void nccl_fail(const char* call, ncclResult_t r, ncclComm_t comm, const char* file,
                            int line) {
  std::string msg = std::string(call) + " failed: " + ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  const char* base = std::strrchr(file, '/');
  msg += std::string(" [") + (base ? base + 1 : file) + ":" + std::to_string(line) + "]";
  throw CommError(msg);
}

}  // namespace detail

namespace {

using detail::CallSig;
using detail::Deadline;

// The 128 opaque bytes of an ncclUniqueId, as plain data (shared in-process for ranks as threads,
// through the bootstrap transport for ranks as processes).
struct NcclUniqueId {
  std::array<char, 128> bytes{};
};

using cuda_detail::DeviceGuard;

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

// Aborts every NCCL communicator of the process (defined with the registry below).
void abort_everything(const std::string& why);

// One rank's NCCL communicator and what guards it.
struct NcclEngine {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::string name;
  // The name handed to NCCL as ncclConfig.commName: NCCL may keep the pointer past init.
  std::shared_ptr<const std::string> nccl_name;
  CommConfig cfg;
  std::atomic<bool> aborted{false};
  bool comm_released = false;  // ncclCommAbort freed it
  bool borrowed = false;       // adopted from the caller, who destroys it (abort still aborts it)
  mutable std::mutex state_mu;
  std::string reason;
  // NCCL calls on one communicator are serialised. Recursive: a timeout noticed while issuing
  // aborts every communicator, this one included, from the issuing thread.
  std::recursive_mutex call_mu;
  std::shared_ptr<Allocator> scratch;
  // MESHRT_NCCL_HALF_REDUCE=native: let NCCL reduce bf16 / f16 itself (faster, less exact).
  bool native_half = [] { return env_choice("MESHRT_NCCL_HALF_REDUCE") == "native"; }();

  ~NcclEngine() {
    if (comm == nullptr || comm_released || borrowed) return;
    try {
      DeviceGuard g(device);
      // Finalize flushes outstanding work; it is non-blocking, so wait for it (bounded).
      ncclResult_t r = ncclCommFinalize(comm);
      Deadline dl = Deadline::after(cfg.timeout_s > 0 ? cfg.timeout_s : 300);
      ncclResult_t st = r;
      while (st == ncclInProgress && !dl.passed()) {
        std::this_thread::yield();
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) break;
      }
      if (st == ncclSuccess) {
        (void)ncclCommDestroy(comm);
      } else {
        (void)ncclCommAbort(comm);
      }
    } catch (...) {
      (void)ncclCommAbort(comm);
    }
  }

  std::string abort_reason() const {
    std::lock_guard<std::mutex> lk(state_mu);
    return reason;
  }

  // Marks the communicator failed and aborts it (NCCL kernels in flight exit).
  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(state_mu);
      if (aborted.load()) return;
      reason = why;
      aborted.store(true);
    }
    MESHRT_LOG_ERROR("NCCL communicator '" << name << "' (rank " << rank << ") aborted: " << why);
    // Issuers poll `aborted` in their waits and release call_mu promptly; one stuck inside NCCL
    // is what ncclCommAbort is for, so after a grace period abort without the lock.
    std::unique_lock<std::recursive_mutex> lk(call_mu, std::defer_lock);
    for (int i = 0; i < 2000 && !lk.try_lock(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (comm != nullptr && !comm_released) {
      try {
        DeviceGuard g(device);
        (void)ncclCommAbort(comm);
      } catch (...) {
        (void)ncclCommAbort(comm);
      }
      comm_released = true;
    }
  }

  [[noreturn]] void throw_aborted(const std::string& what) const {
    throw CommError(what + " on group '" + name +
                    "' failed: the communicator was aborted: " + abort_reason());
  }

  // Waits until a non-blocking call on `c` finished (ncclCommGetAsyncError leaves InProgress).
  void settle(ncclComm_t c, const std::string& what, const Deadline& dl) {
    ncclResult_t st = ncclInProgress;
    for (int64_t i = 0;; ++i) {
      MESHRT_NCCL_CHECK(ncclCommGetAsyncError(c, &st), c);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) detail::nccl_fail(what.c_str(), st, c, __FILE__, __LINE__);
      if (aborted.load()) throw_aborted(what);
      if (dl.passed()) {
        std::string msg = detail::timeout_message(
            what, name, 0, rank, cfg, "NCCL did not finish the call (is every rank running?)");
        abort_everything(msg);
        throw CommError(msg);
      }
      if (i > 1000) sched_yield();
    }
  }

  Tensor scratch_tensor(int64_t n, DType dt, Stream& s) {
    if (!scratch) {
      const DeviceRuntime* be = cuda_backend();
      MESHRT_CHECK(be != nullptr, "NCCL communicator: no CUDA backend");
      scratch = be->create_caching_allocator(device);
    }
    return Tensor::empty(Shape{n}, dt, scratch, &s);
  }
};

// Every NCCL communicator of the process, and the watchdog thread that polls them.
class NcclRegistry {
 public:
  static NcclRegistry& get() {
    static NcclRegistry r;  // its destructor stops and joins the watchdog at exit
    return r;
  }
  ~NcclRegistry() {
    watchdog_.stop();
    // The CUDA runtime may already be torn down: the watched events are leaked, not destroyed.
    std::lock_guard<std::mutex> lk(mu_);
    if (!inflight_.empty()) leaked_ = new std::vector<Inflight>(std::move(inflight_));
  }

  void add(const std::shared_ptr<NcclEngine>& e) {
    std::lock_guard<std::mutex> lk(mu_);
    engines_.push_back(e);
    start_locked();
  }

  // Watches one operation until `done` completes.
  void watch(const std::shared_ptr<NcclEngine>& e, Event done, std::string what, uint64_t seq,
             Deadline dl) {
    std::lock_guard<std::mutex> lk(mu_);
    inflight_.push_back(Inflight{e, std::move(done), std::move(what), seq, dl});
    start_locked();
  }

  void abort_all(const std::string& why) {
    std::vector<std::shared_ptr<NcclEngine>> live;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& w : engines_) {
        if (auto e = w.lock()) live.push_back(std::move(e));
      }
    }
    for (auto& e : live) e->abort(why);
  }

 private:
  struct Inflight {
    std::weak_ptr<NcclEngine> engine;
    Event done;
    std::string what;
    uint64_t seq;
    Deadline dl;
  };

  // After shutdown began, nothing is watched any more (the process is exiting).
  void start_locked() { (void)watchdog_.start(); }

  // One watchdog round: drops completed operations (their events are pooled, timing-free CUDA
  // events: no host function stalls the stream), times out late ones, polls async errors.
  void tick() {
    {
      std::vector<Inflight> items;
      std::vector<std::shared_ptr<NcclEngine>> live;
      {
        std::lock_guard<std::mutex> lk(mu_);
        items.swap(inflight_);
        std::vector<std::weak_ptr<NcclEngine>> keep;
        for (auto& w : engines_) {
          if (auto e = w.lock()) {
            live.push_back(e);
            keep.push_back(w);
          }
        }
        engines_.swap(keep);
      }
      std::string failure;
      std::vector<Inflight> pending;
      for (auto& it : items) {
        auto e = it.engine.lock();
        if (!e || e->aborted.load()) continue;
        bool done = true;
        try {
          done = it.done.query();
        } catch (...) {
          done = true;  // the stream reports its own error
        }
        if (done) continue;
        if (it.dl.passed() && failure.empty()) {
          failure = detail::timeout_message(
              it.what, e->name, it.seq, e->rank, e->cfg,
              "NCCL does not report which ranks never arrived (MESHRT_COMM_DEBUG=1 compares "
              "every call before it runs)");
        }
        pending.push_back(std::move(it));
      }
      for (auto& e : live) {
        if (!failure.empty()) break;
        if (e->aborted.load()) continue;
        std::unique_lock<std::recursive_mutex> lk(e->call_mu, std::try_to_lock);
        if (!lk.owns_lock() || e->comm == nullptr || e->comm_released) continue;
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(e->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
          failure = "NCCL asynchronous error on group '" + e->name + "' (rank " +
                    std::to_string(e->rank) + "): " + ncclGetErrorString(st);
          const char* last = ncclGetLastError(e->comm);
          if (last && *last) failure += std::string(" (") + last + ")";
        }
      }
      if (!failure.empty()) {
        abort_all(failure);
        pending.clear();
      }
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& p : pending) inflight_.push_back(std::move(p));
    }
  }

  std::mutex mu_;
  std::vector<std::weak_ptr<NcclEngine>> engines_;
  std::vector<Inflight> inflight_;
  std::vector<Inflight>* leaked_ = nullptr;  // reachable from static storage: no leak report
  detail::PollThread watchdog_{std::chrono::milliseconds(50), [this] { tick(); }};
};

void abort_everything(const std::string& why) { NcclRegistry::get().abort_all(why); }

ncclComm_t init_comm(const NcclUniqueId& id, int rank, int size, int device,
                     const std::shared_ptr<const std::string>& keep_name, const CommConfig& cfg) {
  const std::string& name = *keep_name;
  DeviceGuard g(device);
  ncclUniqueId uid;
  static_assert(sizeof(uid.internal) == sizeof(id.bytes));
  std::memcpy(uid.internal, id.bytes.data(), sizeof(uid.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = keep_name->c_str();
  ncclComm_t comm = nullptr;
  MESHRT_NCCL_CHECK(ncclCommInitRankConfig(&comm, size, uid, rank, &config), comm);
  Deadline dl = Deadline::after(cfg.timeout_s);
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) {
    MESHRT_NCCL_CHECK(ncclCommGetAsyncError(comm, &st), comm);
    if (st == ncclInProgress && dl.passed()) {
      (void)ncclCommAbort(comm);
      throw CommError("NCCL initialisation of group '" + name + "' (rank " + std::to_string(rank) +
                      " of " + std::to_string(size) + " on cuda:" + std::to_string(device) +
                      ") did not complete within " + std::to_string(cfg.timeout_s) + " s (" +
                      cfg.timeout_setting + "): are all ranks started, with the same unique id?");
    }
    if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (st != ncclSuccess) {
    ncclComm_t c = comm;
    std::string msg;
    try {
      detail::nccl_fail("ncclCommInitRankConfig", st, c, __FILE__, __LINE__);
    } catch (const CommError& e) {
      msg = e.what();
    }
    (void)ncclCommAbort(c);
    throw CommError(msg);
  }
  return comm;
}

std::unique_ptr<Communicator> make_nccl_comm(ncclComm_t comm, int rank, int size, int device,
                                             std::shared_ptr<const std::string> name,
                                             CommConfig cfg, bool borrowed = false);

class NcclImpl final : public CommImpl {
 public:
  NcclImpl(ncclComm_t comm, int rank, int size, int device, std::shared_ptr<const std::string> name,
           CommConfig cfg, bool borrowed)
      : e_(std::make_shared<NcclEngine>()) {
    e_->comm = comm;
    e_->borrowed = borrowed;
    e_->rank = rank;
    e_->size = size;
    e_->device = device;
    e_->name = *name;
    e_->nccl_name = std::move(name);
    e_->cfg = cfg;
    NcclRegistry::get().add(e_);
  }

  std::string_view backend() const override { return "nccl"; }
  bool aborted() const override { return e_->aborted.load(); }
  std::string abort_reason() const override { return e_->abort_reason(); }

  void issue(CommCall c, Stream& stream) override {
    NcclEngine& e = *e_;
    const std::string what = c.str();
    Deadline dl = Deadline::after(e.cfg.timeout_s);
    {
      std::lock_guard<std::recursive_mutex> lk(e.call_mu);
      if (e.aborted.load()) e.throw_aborted(what);
      DeviceGuard g(e.device);
      const Issue is{c, what, stream, static_cast<cudaStream_t>(stream.native_handle()), dl};
      if (c.in.defined()) c.in.storage()->record_stream(stream);
      if (c.out.defined()) c.out.storage()->record_stream(stream);
      const bool p2p = c.op == CommOp::Send || c.op == CommOp::Recv;
      if (e.cfg.debug && !p2p && e.size > 1) compare_calls(is);
      run(is);
    }
    // The watchdog polls this event: completion is tracked without a host function on the
    // stream (which would stall it until the host ran it).
    NcclRegistry::get().watch(e_, stream.record(), what, c.seq, dl);
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      uint64_t seq) override {
    NcclEngine& e = *e_;
    CallSig sig = CallSig::make(CommOp::Split, DType::f32, ReduceOp::Sum, 0, -1, seq);
    sig.color = color;
    const std::string what = sig.str();
    Deadline dl = Deadline::after(e.cfg.timeout_s);
    std::lock_guard<std::recursive_mutex> lk(e.call_mu);
    if (e.aborted.load()) e.throw_aborted(what);
    DeviceGuard g(e.device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto keep_name = std::make_shared<const std::string>(name);
    config.commName = keep_name->c_str();
    ncclComm_t nc = nullptr;
    ncclResult_t r = MESHRT_NCCL_CHECK(
        ncclCommSplit(e.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &config), e.comm);
    if (r == ncclInProgress) e.settle(nc != nullptr ? nc : e.comm, "ncclCommSplit", dl);
    if (nc == nullptr) return nullptr;
    int nrank = 0, nsize = 0;
    MESHRT_NCCL_CHECK(ncclCommUserRank(nc, &nrank), nc);
    MESHRT_NCCL_CHECK(ncclCommCount(nc, &nsize), nc);
    return make_nccl_comm(nc, nrank, nsize, e.device, std::move(keep_name), e.cfg);
  }

  void abort(const std::string& reason) override {
    NcclRegistry::get().abort_all("rank " + std::to_string(e_->rank) + " of group '" + e_->name +
                                  "': " + reason);
  }

  void wait_issued(uint64_t, const std::unordered_map<int, uint64_t>&,
                   const std::unordered_map<int, uint64_t>&) override {
    // Operations are on CUDA streams: issuing them is all that happens on this thread.
  }

 private:
  // One call being issued.
  struct Issue {
    const CommCall& c;
    const std::string& what;
    Stream& stream;
    cudaStream_t cs;
    const Deadline& dl;
  };

  // The result of a call on the (non-blocking) communicator: wait when it is still in progress.
  void done(ncclResult_t r, const Issue& is) {
    if (r == ncclInProgress) e_->settle(e_->comm, is.what, is.dl);
  }

  // MESHRT_COMM_DEBUG=1: all-gathers every rank's call signature through NCCL and compares them
  // on the host before the collective runs (this waits for the stream).
  void compare_calls(const Issue& is) {
    NcclEngine& e = *e_;
    const CommCall& c = is.c;
    const cudaStream_t cs = is.cs;
    const int n = e.size;
    std::vector<CallSig> all(static_cast<size_t>(n));
    CallSig mine = CallSig::make(c.op, c.dtype, c.redop, c.count, c.root, c.seq);
    Tensor dev = e.scratch_tensor(static_cast<int64_t>(n) * CallSig::kWords, DType::i64, is.stream);
    auto* base = static_cast<int64_t*>(dev.data_ptr());
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(base + static_cast<int64_t>(e.rank) * CallSig::kWords, &mine,
                                      sizeof(mine), cudaMemcpyHostToDevice, cs));
    done(MESHRT_NCCL_CHECK(ncclAllGather(base + static_cast<int64_t>(e.rank) * CallSig::kWords,
                                         base, CallSig::kWords, ncclInt64, e.comm, cs),
                           e.comm),
         is);
    // Wait for the all-gather on an event, within the deadline, and only then copy: a copy into
    // pageable memory blocks the host until the stream reaches it, which a rank that never
    // arrives would make forever, with call_mu held.
    cudaEvent_t ev = nullptr;
    MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    std::unique_ptr<CUevent_st, void (*)(cudaEvent_t)> ev_guard(
        ev, [](cudaEvent_t x) { (void)cudaEventDestroy(x); });
    MESHRT_CUDA_CHECK(cudaEventRecord(ev, cs));
    const detail::PollResult r = detail::poll_until(
        [&] {
          const cudaError_t q = cudaEventQuery(ev);
          if (q == cudaErrorNotReady) return false;
          MESHRT_CUDA_CHECK(q);
          return true;
        },
        [&] { return e.aborted.load(); }, is.dl);
    if (r == detail::PollResult::Aborted) e.throw_aborted(is.what);
    if (r == detail::PollResult::TimedOut) {
      std::string msg = detail::timeout_message(
          is.what, e.name, c.seq, e.rank, e.cfg,
          "the call comparison (MESHRT_COMM_DEBUG=1) did not complete: a rank never arrived");
      NcclRegistry::get().abort_all(msg);
      throw CommError(msg);
    }
    // On this thread's default stream: the copy waits for nothing enqueued on `cs` since.
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(all.data(), base, sizeof(CallSig) * all.size(),
                                      cudaMemcpyDeviceToHost, cudaStreamPerThread));
    MESHRT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    std::string mm = detail::mismatch_message(e.name, all);
    if (!mm.empty()) throw CommError(mm);
  }

  void run(const Issue& is) {
    switch (is.c.op) {
      case CommOp::AllReduce:
        return all_reduce(is);
      case CommOp::ReduceScatter:
        return reduce_scatter(is);
      case CommOp::AllGather:
        return all_gather(is);
      case CommOp::Broadcast:
        return broadcast(is);
      case CommOp::AllToAll:
        return all_to_all(is);
      case CommOp::Send:
        return send(is);
      case CommOp::Recv:
        return recv(is);
      case CommOp::Barrier:
        return barrier(is);
      case CommOp::Split:
        break;
    }
    MESHRT_FAIL("NCCL communicator: unexpected operation " << comm_op_name(is.c.op));
  }

  // bf16 / f16 reductions reduce in f32 unless MESHRT_NCCL_HALF_REDUCE=native.
  bool widen(const CommCall& c) const {
    return (c.dtype == DType::bf16 || c.dtype == DType::f16) && !e_->native_half && c.count > 0;
  }

  // Reduces a 16-bit call in f32: widens `n_in` input elements on the stream, runs
  // reduce(wide_in, wide_out) and narrows the `n_out` results into the output, rounding once.
  template <class Reduce>
  void reduce_wide(const Issue& is, int64_t n_in, int64_t n_out, Reduce reduce) {
    Tensor wide_in = e_->scratch_tensor(n_in, DType::f32, is.stream);
    Tensor wide_out = n_in == n_out ? wide_in : e_->scratch_tensor(n_out, DType::f32, is.stream);
    wide_in.copy_(is.c.in.view(Shape{n_in}), is.stream);
    done(reduce(wide_in.data_ptr(), wide_out.data_ptr()), is);
    Tensor o = is.c.out.view(Shape{n_out});
    o.copy_(wide_out, is.stream);
  }

  void all_reduce(const Issue& is) {
    const CommCall& c = is.c;
    ncclComm_t comm = e_->comm;
    const size_t count = static_cast<size_t>(c.count);
    if (widen(c)) {
      reduce_wide(is, c.count, c.count, [&](void* in, void* out) {
        return MESHRT_NCCL_CHECK(
            ncclAllReduce(in, out, count, ncclFloat32, nccl_op(c.redop), comm, is.cs), comm);
      });
      return;
    }
    done(MESHRT_NCCL_CHECK(ncclAllReduce(c.in.data_ptr(), c.out.data_ptr(), count,
                                         nccl_type(c.dtype), nccl_op(c.redop), comm, is.cs),
                           comm),
         is);
  }

  void reduce_scatter(const Issue& is) {
    const CommCall& c = is.c;
    ncclComm_t comm = e_->comm;
    const size_t count = static_cast<size_t>(c.count);
    if (widen(c)) {
      reduce_wide(is, c.count * e_->size, c.count, [&](void* in, void* out) {
        return MESHRT_NCCL_CHECK(
            ncclReduceScatter(in, out, count, ncclFloat32, nccl_op(c.redop), comm, is.cs), comm);
      });
      return;
    }
    done(MESHRT_NCCL_CHECK(ncclReduceScatter(c.in.data_ptr(), c.out.data_ptr(), count,
                                             nccl_type(c.dtype), nccl_op(c.redop), comm, is.cs),
                           comm),
         is);
  }

  void all_gather(const Issue& is) {
    const CommCall& c = is.c;
    ncclComm_t comm = e_->comm;
    done(MESHRT_NCCL_CHECK(
             ncclAllGather(c.in.data_ptr(), c.out.data_ptr(), static_cast<size_t>(c.count),
                           nccl_type(c.dtype), comm, is.cs),
             comm),
         is);
  }

  void broadcast(const Issue& is) {
    const CommCall& c = is.c;
    ncclComm_t comm = e_->comm;
    done(MESHRT_NCCL_CHECK(
             ncclBroadcast(c.in.data_ptr(), c.out.data_ptr(), static_cast<size_t>(c.count),
                           nccl_type(c.dtype), c.root, comm, is.cs),
             comm),
         is);
  }

  void all_to_all(const Issue& is) {
    const CommCall& c = is.c;
    NcclEngine& e = *e_;
    ncclComm_t comm = e.comm;
    const size_t count = static_cast<size_t>(c.count);
    const ncclDataType_t t = nccl_type(c.dtype);
    const size_t block = count * dtype_size(c.dtype);
    const char* src = static_cast<const char*>(c.in.data_ptr());
    char* out = static_cast<char*>(c.out.data_ptr());
    Tensor stage;
    if (c.in_place && block > 0) {
      // Peers' receives would overwrite blocks not sent yet: send from a copy.
      stage = e.scratch_tensor(c.count * e.size, c.dtype, is.stream);
      MESHRT_CUDA_CHECK(
          cudaMemcpyAsync(stage.data_ptr(), src, block * e.size, cudaMemcpyDeviceToDevice, is.cs));
      src = static_cast<const char*>(stage.data_ptr());
    }
    MESHRT_NCCL_CHECK(ncclGroupStart(), comm);
    for (int j = 0; j < e.size; ++j) {
      MESHRT_NCCL_CHECK(ncclSend(src + block * j, count, t, j, comm, is.cs), comm);
      MESHRT_NCCL_CHECK(ncclRecv(out + block * j, count, t, j, comm, is.cs), comm);
    }
    done(MESHRT_NCCL_CHECK(ncclGroupEnd(), comm), is);
  }

  void send(const Issue& is) {
    const CommCall& c = is.c;
    ncclComm_t comm = e_->comm;
    done(MESHRT_NCCL_CHECK(ncclSend(c.in.data_ptr(), static_cast<size_t>(c.count),
                                    nccl_type(c.dtype), c.peer, comm, is.cs),
                           comm),
         is);
  }

  void recv(const Issue& is) {
    const CommCall& c = is.c;
    ncclComm_t comm = e_->comm;
    done(MESHRT_NCCL_CHECK(ncclRecv(c.out.data_ptr(), static_cast<size_t>(c.count),
                                    nccl_type(c.dtype), c.peer, comm, is.cs),
                           comm),
         is);
  }

  void barrier(const Issue& is) {
    ncclComm_t comm = e_->comm;
    Tensor one = e_->scratch_tensor(1, DType::f32, is.stream);
    done(MESHRT_NCCL_CHECK(
             ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm, is.cs),
             comm),
         is);
  }

  std::shared_ptr<NcclEngine> e_;
};

std::unique_ptr<Communicator> make_nccl_comm(ncclComm_t comm, int rank, int size, int device,
                                             std::shared_ptr<const std::string> name,
                                             CommConfig cfg, bool borrowed) {
  std::string n = *name;
  return std::make_unique<Communicator>(
      rank, size, std::move(n), Device::cuda(device), cfg,
      std::make_unique<NcclImpl>(comm, rank, size, device, std::move(name), cfg, borrowed));
}

// ncclGetUniqueId: made once (by rank 0) and handed to every rank.
NcclUniqueId nccl_unique_id() {
  ncclUniqueId uid;
  MESHRT_NCCL_CHECK(ncclGetUniqueId(&uid), nullptr);
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), uid.internal, sizeof(uid.internal));
  return id;
}

// Rank `rank` of `size` on CUDA device `device`. Initialisation is non-blocking and collective:
// every rank must call this (from its own thread when ranks are threads); it gives up with
// CommError after the config's timeout.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int rank, int size,
                                                     int device, const std::string& name,
                                                     CommConfig config) {
  MESHRT_CHECK(size >= 1 && rank >= 0 && rank < size,
               "NCCL communicator: rank " << rank << " outside [0, " << size << ")");
  std::string why;
  if (!cuda_available(&why)) {
    throw CommError("NCCL communicator '" + name + "' on cuda:" + std::to_string(device) +
                    ": CUDA is unavailable: " + why);
  }
  auto keep_name = std::make_shared<const std::string>(name);
  ncclComm_t comm = init_comm(id, rank, size, device, keep_name, config);
  return make_nccl_comm(comm, rank, size, device, std::move(keep_name), config);
}

// Ranks as threads share a unique id made here; process ranks get rank 0's through the launch's
// transport when their world communicator is made.
WorldFactory nccl_prepare(const WorldPlan& plan) {
  std::optional<NcclUniqueId> local_id;
  if (plan.transport == nullptr) local_id = nccl_unique_id();
  return [local_id, local = plan.local, world = plan.world_size, cfg = plan.config,
          transport = plan.transport](int i) {
    const RankPlacement& p = local[static_cast<size_t>(i)];
    NcclUniqueId id;
    if (local_id) {
      id = *local_id;
    } else {
      if (p.rank == 0) id = nccl_unique_id();
      std::vector<std::string> all =
          transport->all_gather("nccl-id", std::string(id.bytes.begin(), id.bytes.end()));
      MESHRT_CHECK(all[0].size() == id.bytes.size(),
                   "NCCL bootstrap: rank 0 sent " << all[0].size() << " bytes for the unique id, "
                                                  << "expected " << id.bytes.size());
      std::copy(all[0].begin(), all[0].end(), id.bytes.begin());
    }
    return make_nccl_communicator(id, p.rank, world, p.device.index, "world", cfg);
  };
}

std::unique_ptr<Communicator> nccl_adopt(void* nccl_comm, int device, const std::string& name,
                                         CommConfig config) {
  MESHRT_CHECK(nccl_comm != nullptr, "adopt_nccl_communicator: the NCCL communicator is null");
  std::string why;
  MESHRT_CHECK(cuda_available(&why), "adopting an NCCL communicator on cuda:"
                                         << device << ": CUDA is unavailable: " << why);
  ncclComm_t comm = static_cast<ncclComm_t>(nccl_comm);
  int rank = 0;
  int size = 0;
  MESHRT_NCCL_CHECK(ncclCommUserRank(comm, &rank), comm);
  MESHRT_NCCL_CHECK(ncclCommCount(comm, &size), comm);
  int cu_dev = -1;
  MESHRT_NCCL_CHECK(ncclCommCuDevice(comm, &cu_dev), comm);
  MESHRT_CHECK(cu_dev == device, "adopting an NCCL communicator: it runs on cuda:"
                                     << cu_dev << " but device " << device
                                     << " was given: pass the communicator's device");
  return make_nccl_comm(comm, rank, size, device, std::make_shared<const std::string>(name), config,
                        /*borrowed=*/true);
}

std::string nccl_version() {
  int v = 0;
  MESHRT_NCCL_CHECK(ncclGetVersion(&v), nullptr);
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
}

}  // namespace

namespace detail {
const NcclBackend& nccl_table() {
  static const NcclBackend t{nccl_prepare, nccl_adopt, nccl_version};
  return t;
}
}  // namespace detail

}  // namespace meshrt
