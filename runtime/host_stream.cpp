// Host streams: a worker thread per stream draining an in-order queue; events that really signal.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/event_impl.h"
#include "runtime/logging.h"
#include "runtime/stream.h"
#include "runtime/thread.h"
#include "runtime/thread_inline.h"

namespace meshrt {

namespace {

using Clock = std::chrono::steady_clock;

// Set on stream worker threads: work a task enqueues elsewhere (an event recorded as its captures
// are freed) never blocks under MESHRT_LAUNCH_BLOCKING, or two workers could wait on each other.
thread_local bool tl_stream_worker = false;
// Set by NonBlockingEnqueue.
thread_local bool tl_no_block = false;
// Set by set_thread_inline: enqueues from this thread onto an idle stream run here.
thread_local bool tl_inline = false;

// The jitter's random delays, one generator per thread that runs tasks.
std::mt19937& task_rng() {
  thread_local std::mt19937 rng(
      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id())));
  return rng;
}

// How long an idle stream worker, or a thread waiting on a host event, polls (yielding the core
// between looks) before it sleeps on its condition variable: a collective or a short task that
// ends within it costs no futex wake-up (MESHRT_HOST_POLL_US, 0 disables).
// Read where a refusal reaches a caller: when a stream is created (each read, so that a bad value
// is refused by every creation), and once for the threads waiting on host events.
Clock::duration read_host_poll_window() {
  return std::chrono::microseconds(env_int("MESHRT_HOST_POLL_US", 50));
}
Clock::duration host_poll_window() {
  static const Clock::duration d = read_host_poll_window();
  return d;
}

// Polls `ready` for `window`, yielding between looks; true when it held.
template <class Ready>
bool poll_briefly(Clock::duration window, Ready ready) {
  if (window.count() <= 0) return ready();
  const auto until = Clock::now() + window;
  for (;;) {
    if (ready()) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::yield();
  }
}

class HostEventImpl final : public EventImpl {
 public:
  void signal(std::exception_ptr err) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      err_ = std::move(err);
      time_ = Clock::now();
      done_ = true;
      done_flag_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  // Waits without throwing; returns the error carried by the event, if any.
  std::exception_ptr wait() {
    poll_briefly(host_poll_window(), [&] { return done_flag_.load(std::memory_order_acquire); });
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    return err_;
  }
  void synchronize() override {
    if (auto e = wait()) std::rethrow_exception(e);
  }
  bool query() override {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  float elapsed_ms_since(const EventImpl& start) const override {
    auto* s = dynamic_cast<const HostEventImpl*>(&start);
    MESHRT_CHECK(s != nullptr, "Event::elapsed_ms: start event is not a host event");
    std::scoped_lock lk(mu_, s->mu_);
    MESHRT_CHECK(done_ && s->done_, "Event::elapsed_ms: both events must have completed");
    return std::chrono::duration<float, std::milli>(time_ - s->time_).count();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> done_flag_{false};  // done_, readable without the lock (polling)
  std::exception_ptr err_;
  Clock::time_point time_;
};

class HostStream final : public Stream {
 public:
  HostStream(std::string name, int device_index, bool jitter, bool blocking)
      : name_(std::move(name)),
        device_index_(device_index),
        jitter_(jitter),
        blocking_(blocking),
        // Read here, on the creating thread, where a bad MESHRT_HOST_POLL_US is an error of the
        // call that creates the stream; the worker never reads the environment.
        poll_window_(read_host_poll_window()) {
    int rank = log_rank(), world = log_world();
    worker_ = start_thread(
        [this, rank, world] {
          tl_stream_worker = true;
          set_log_rank(rank, world);
          // Nothing may leave a thread's entry (std::terminate). Tasks' exceptions are caught
          // where they run; one from the worker's own loop (none is expected) becomes the
          // stream's error, which its next synchronize or recorded event reports, and the worker
          // goes on draining the queue without polling, so no waiter hangs.
          for (;;) {
            try {
              run();
              return;
            } catch (...) {
              set_error(std::current_exception());
              poll_window_ = Clock::duration::zero();
            }
          }
        },
        "the worker thread of stream '" + name_ + "'",
        "run fewer ranks or raise ulimit -u / ulimit -v");
  }

  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Device device() const override { return Device::cpu(device_index_); }
  std::string name() const override { return name_; }
  void* native_handle() const override { return nullptr; }

  void enqueue(std::function<void()> fn) override {
    if (tl_inline && !tl_stream_worker && run_inline(fn)) return;
    const bool own = std::this_thread::get_id() == worker_.get_id();
    uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      // While the stream shuts down its worker still drains the queue, so work it enqueues
      // itself (an event recorded as a task's captures are freed) still runs.
      MESHRT_CHECK(!stop_ || own, "stream '" << name_ << "': enqueue after shutdown");
      q_.push_back(std::move(fn));
      ticket = ++enqueued_;
      queued_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_one();
    // MESHRT_LAUNCH_BLOCKING: return once the task ran and its captures were released, so that
    // the tensors a task holds are freed in program order (as on a CUDA stream, where the
    // caching allocator reuses a block at once) and an error surfaces at the call that caused it.
    if (blocking_ && !tl_stream_worker && !tl_no_block) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return finished_ >= ticket; });
    }
  }

  Event record() override {
    auto ev = std::make_shared<HostEventImpl>();
    enqueue([this, ev] { ev->signal(current_error()); });
    return EventAccess::wrap(ev);
  }

  void wait(const Event& e) override {
    if (!e.valid()) return;
    std::shared_ptr<EventImpl> impl = EventAccess::impl(e);
    if (auto* host = dynamic_cast<HostEventImpl*>(impl.get())) {
      enqueue([this, impl, host] {
        if (auto err = host->wait()) set_error(err);
      });
    } else {
      // A device event: block this queue until it completes.
      enqueue([impl] { impl->synchronize(); });
    }
  }

  void synchronize() override {
    Event e = record();
    auto* host = static_cast<HostEventImpl*>(EventAccess::impl(e).get());
    help();
    std::exception_ptr err = host->wait();
    if (err) {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (error_ == err) error_ = nullptr;  // reported once; the stream is usable again
      std::rethrow_exception(err);
    }
  }

 private:
  std::exception_ptr current_error() {
    std::lock_guard<std::mutex> lk(err_mu_);
    return error_;
  }
  void set_error(std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (!error_) error_ = std::move(e);
  }

  // Runs one task taken from the queue (by the worker or a helping caller), then hands the
  // queue back. `fn` is released here, before the next task, so its captured tensors are freed.
  void execute(std::function<void()>& fn) {
    if (jitter_) {
      std::uniform_int_distribution<int> delay_us(0, 200);
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us(task_rng())));
    }
    try {
      fn();
    } catch (...) {
      set_error(std::current_exception());
    }
    fn = nullptr;
    bool wake = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      running_ = false;
      running_flag_.store(false, std::memory_order_release);
      ++finished_;
      wake = !q_.empty() || stop_;
    }
    if (blocking_) done_cv_.notify_all();
    if (wake) cv_.notify_one();  // the worker may take the next task (or end)
  }

  // set_thread_inline: runs `fn` on the calling thread, now, when nothing is queued or running
  // (so it overtakes nothing, and the worker takes nothing until it ended); false, with `fn`
  // untouched, when the stream is busy (the caller then queues it). Inline tasks leave the
  // queue's counters alone: an idle worker goes on to sleep instead of polling for them.
  bool run_inline(std::function<void()>& fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_ || running_ || !q_.empty()) return false;
      running_ = true;
      running_flag_.store(true, std::memory_order_release);
      ++enqueued_;
    }
    tl_stream_worker = true;  // what the task enqueues elsewhere neither blocks nor inlines
    execute(fn);
    tl_stream_worker = false;
    return true;
  }

  // Takes the next task off the queue for the calling thread (mu_ held, none running).
  std::function<void()> take_locked() {
    std::function<void()> fn = std::move(q_.front());
    q_.pop_front();
    running_ = true;
    running_flag_.store(true, std::memory_order_release);
    taken_.fetch_add(1, std::memory_order_release);
    return fn;
  }

  // A queued task that the worker may take: none is running (a helping caller's included).
  bool worker_may_take() const {
    return queued_.load(std::memory_order_acquire) != taken_.load(std::memory_order_acquire) &&
           !running_flag_.load(std::memory_order_acquire);
  }

  // A thread about to wait for this stream runs its queued tasks itself while the worker is
  // idle (in order, one at a time, as the worker would): a short task such as a small
  // collective then costs no hand-over to the worker and back. It stops when the worker is
  // busy or the queue is empty; the caller then waits as before.
  void help() {
    const bool was_worker = tl_stream_worker;
    tl_stream_worker = true;  // what a task enqueues elsewhere must not block (as on the worker)
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (running_ || q_.empty()) break;
        fn = take_locked();
      }
      execute(fn);
    }
    tl_stream_worker = was_worker;
  }

  void run() {
    for (;;) {
      std::function<void()> fn;
      // An idle worker polls a while before it sleeps: the next task of a busy stream then
      // starts without a wake-up. Tasks that a helping caller takes keep it polling: the stream
      // is busy, and a sleeping worker would cost every enqueue a futex wake-up.
      uint64_t seen = queued_.load(std::memory_order_acquire);
      while (
          poll_briefly(poll_window_, [&] { return worker_may_take() || queued_.load() != seen; }) &&
          !worker_may_take())
        seen = queued_.load(std::memory_order_acquire);
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return (stop_ && !running_) || (!q_.empty() && !running_); });
        if (q_.empty()) return;  // stop_ and drained
        fn = take_locked();
      }
      execute(fn);
    }
  }

  std::string name_;
  int device_index_;
  bool jitter_;
  bool blocking_;
  Clock::duration poll_window_;  // how long the idle worker polls (worker only after start)
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;  // blocking_: a task finished
  uint64_t enqueued_ = 0, finished_ = 0;
  std::deque<std::function<void()>> q_;
  std::atomic<uint64_t> queued_{0};        // tasks ever enqueued (polled without the lock)
  std::atomic<uint64_t> taken_{0};         // tasks taken off the queue (under mu_; polled without)
  bool running_ = false;                   // a task taken off the queue is running (under mu_)
  std::atomic<bool> running_flag_{false};  // running_, polled without the lock
  bool stop_ = false;
  std::mutex err_mu_;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace

void Event::synchronize() const {
  if (impl_) impl_->synchronize();
}
bool Event::query() const { return !impl_ || impl_->query(); }
float Event::elapsed_ms(const Event& start) const {
  MESHRT_CHECK(impl_ && start.impl_, "Event::elapsed_ms needs two recorded events");
  return impl_->elapsed_ms_since(*start.impl_);
}

bool stream_jitter_from_env() {
  static const bool on = env_switch("MESHRT_STREAM_JITTER");
  return on;
}

namespace {
// -1: not set by set_host_launch_blocking (MESHRT_LAUNCH_BLOCKING decides).
std::atomic<int> g_launch_blocking{-1};
}  // namespace

bool launch_blocking_from_env() {
  static const bool on = env_switch("MESHRT_LAUNCH_BLOCKING");
  const int set = g_launch_blocking.load();
  return set < 0 ? on : set == 1;
}

NonBlockingEnqueue::NonBlockingEnqueue() : prev_(tl_no_block) { tl_no_block = true; }
NonBlockingEnqueue::~NonBlockingEnqueue() { tl_no_block = prev_; }

bool set_thread_inline(bool on) {
  const bool prev = tl_inline;
  tl_inline = on;
  return prev;
}

void set_host_launch_blocking(int mode) { g_launch_blocking.store(mode < 0 ? -1 : mode ? 1 : 0); }

std::unique_ptr<Stream> make_host_stream(std::string name, int device_index) {
  return std::make_unique<HostStream>(std::move(name), device_index, stream_jitter_from_env(),
                                      launch_blocking_from_env());
}

std::unique_ptr<Stream> make_host_stream_jitter(std::string name, bool jitter) {
  return std::make_unique<HostStream>(std::move(name), 0, jitter, false);
}

std::unique_ptr<Stream> make_host_stream_blocking(std::string name, bool blocking) {
  return std::make_unique<HostStream>(std::move(name), 0, false, blocking);
}

}  // namespace meshrt
