// Stream / Event: in-order asynchronous work queues and the points that order work across them.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "meshrt/export.h"
#include "runtime/device.h"

namespace meshrt {

// What a backend's event implements (runtime/event_impl.h): not part of the user-facing API.
class EventImpl;

// A point on a stream. Cheap to copy (shared state). Default-constructed events are "already
// complete". An event records the error of the work before it, if any; synchronize() rethrows it.
class MESHRT_API Event {
 public:
  Event() = default;

  void synchronize() const;
  bool query() const;
  bool valid() const { return impl_ != nullptr; }
  // Milliseconds elapsed between `start` and this event (both from Stream::record_timed()).
  float elapsed_ms(const Event& start) const;

 private:
  friend struct EventAccess;  // the backends' door to impl_ (runtime/event_impl.h)
  explicit Event(std::shared_ptr<EventImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<EventImpl> impl_;
};

class MESHRT_API Stream {
 public:
  Stream() : alive_(std::make_shared<char>(0)) {}
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // Expires when the stream is destroyed (after its work drained), so holders of a Stream*
  // (the allocators) can tell whether it still exists.
  std::weak_ptr<const void> lifetime() const { return alive_; }
  virtual Device device() const = 0;

  // Runs fn on this stream in order. Host streams run it on their worker thread; CUDA streams run
  // it as a host function once prior device work on the stream is done (fn must not call CUDA).
  // An exception thrown by fn is captured: later events carry it and synchronize() rethrows it.
  virtual void enqueue(std::function<void()> fn) = 0;
  // Keeps `owner` alive until the work enqueued so far on this stream has finished, without
  // delaying the stream: host streams hold it in a task; CUDA streams behind a recorded event,
  // released by later calls into the stream once it completed (no host callback that would stall
  // the stream until the host runs it).
  virtual void hold_until_done(std::shared_ptr<const void> owner) {
    enqueue([o = std::move(owner)] {});
  }
  // Marks the current end of this stream. On CUDA streams the event is a pooled, timing-free
  // CUDA event (cheap to record and wait on): it cannot be timed.
  virtual Event record() = 0;
  // Like record(), for events that Event::elapsed_ms times (host events always can).
  virtual Event record_timed() { return record(); }
  // Work enqueued after this call starts only after `e` completes.
  virtual void wait(const Event& e) = 0;
  // Blocks until everything enqueued so far has run; rethrows the first captured error and
  // clears it, so the stream can be used again (Event::synchronize rethrows without clearing).
  virtual void synchronize() = 0;
  // cudaStream_t for CUDA streams, nullptr for host streams.
  virtual void* native_handle() const = 0;
  virtual std::string name() const = 0;

  // The rank whose communication this stream carries. The first communicator to issue on a
  // stream binds it to `owner` (its rank's shared state, alive as long as that rank's
  // communicators) and `owner_rank`; while that owner lives, another owner is refused: bind
  // returns false and sets *bound_rank to the owner's rank. A stream of one rank used by
  // another's collective would queue both ranks' halves behind each other and hang.
  bool bind_comm_owner(const std::shared_ptr<const void>& owner, int owner_rank, int* bound_rank);

 private:
  std::shared_ptr<const void> alive_;
  std::mutex owner_mu_;
  std::weak_ptr<const void> comm_owner_;
  int comm_owner_rank_ = -1;
};

inline bool Stream::bind_comm_owner(const std::shared_ptr<const void>& owner, int owner_rank,
                                    int* bound_rank) {
  std::lock_guard<std::mutex> lk(owner_mu_);
  std::shared_ptr<const void> cur = comm_owner_.lock();
  if (cur && cur != owner) {
    *bound_rank = comm_owner_rank_;
    return false;
  }
  if (!cur) {
    comm_owner_ = owner;
    comm_owner_rank_ = owner_rank;
  }
  return true;
}

// A host stream: one worker thread draining a queue. `name` shows in logs and traces.
// With MESHRT_STREAM_JITTER=1 in the environment (or jitter=true) every task is preceded by a
// random short delay (0..200 us) so a missing wait shows up in tests as a wrong result.
// With MESHRT_LAUNCH_BLOCKING=1 (or blocking=true) an enqueue from outside a stream worker (and
// outside a NonBlockingEnqueue scope) returns only once its task ran and released its captures
// (as CUDA_LAUNCH_BLOCKING=1 does for kernels):
// tensors are freed in program order, so the allocator's peak is the program's, without what
// queued tasks hold while the host runs ahead.
MESHRT_API std::unique_ptr<Stream> make_host_stream(std::string name = "host",
                                                    int device_index = 0);
MESHRT_API std::unique_ptr<Stream> make_host_stream_jitter(std::string name, bool jitter);
MESHRT_API std::unique_ptr<Stream> make_host_stream_blocking(std::string name, bool blocking);

// Whether MESHRT_STREAM_JITTER=1 is set (read once).
MESHRT_API bool stream_jitter_from_env();
// Whether host streams created now block (MESHRT_LAUNCH_BLOCKING=1, read once, unless overridden).
MESHRT_API bool launch_blocking_from_env();
// Overrides MESHRT_LAUNCH_BLOCKING for host streams created from now on: 1 on, 0 off, -1 back to
// the environment's choice (tests, and benchmarks that measure the program-order memory peak).
MESHRT_API void set_host_launch_blocking(int mode);

// While one lives, enqueues from this thread do not block under MESHRT_LAUNCH_BLOCKING. The
// Communicator issues under one: a collective or send waits for its peers, and a host thread
// blocked in its send could never post the receive its peer's send waits for.
class MESHRT_API NonBlockingEnqueue {
 public:
  NonBlockingEnqueue();
  ~NonBlockingEnqueue();
  NonBlockingEnqueue(const NonBlockingEnqueue&) = delete;
  NonBlockingEnqueue& operator=(const NonBlockingEnqueue&) = delete;

 private:
  bool prev_;
};

}  // namespace meshrt
