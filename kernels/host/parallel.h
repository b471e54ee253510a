// Per-rank host thread pool and the BLAS threading policy of host kernels.
#pragma once

// Threading policy (decided here, documented in kernels/ops.h):
// Ranks are threads of one process, and OpenBLAS's thread count is process-global
// (openblas_set_num_threads) while its pthread server is shared by every caller. Letting each rank
// call a multi-threaded OpenBLAS would either oversubscribe the cores (ranks x BLAS threads) or
// serialise the ranks on OpenBLAS's server lock. So meshrt sets OpenBLAS to one thread and does
// the parallelism itself: each rank (Context) owns a pool of T = max(1, cores / local_ranks)
// threads (MESHRT_HOST_THREADS overrides), counting the calling stream worker, and splits a GEMM
// into panels, each a single-threaded sgemm call. Concurrent single-threaded OpenBLAS calls from
// different threads are safe (its buffer pool is locked). The total stays at `cores` threads
// however many ranks run, and a rank's GEMM never waits on another rank's.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/context.h"

namespace meshrt::kernels::host {

class ThreadPool {
 public:
  // `threads` counts the caller: a pool of 1 runs everything on the calling thread.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }
  // Runs fn(task) for task in [0, ntasks), spread over the pool and the calling thread; returns
  // when all are done and rethrows the first exception. Safe to call from several threads at
  // once (jobs queue up; each caller always works on its own job, so nothing deadlocks).
  void run(int64_t ntasks, const std::function<void(int64_t)>& fn);
  // Splits [0, n) into at most size() * 4 contiguous ranges of at least `grain` items.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;
  void worker_loop();

  int threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Usable cores of the calling thread (its affinity mask: a bound rank's share), at least 1.
int usable_cores();
// The rank's pool (created on first use, sized cores / ctx.local_ranks()).
ThreadPool& pool(Context& ctx);
// Sets OpenBLAS to one thread if something changed it (cheap check on every GEMM); the first
// call also warns (log) when blas_core_advice() has something to say.
void ensure_blas_single_threaded();
// Empty, or advice when OpenBLAS runs pre-AVX kernels on a CPU with AVX2 / AVX-512 (its
// DYNAMIC_ARCH table predates the CPU, as OpenBLAS 0.3.21 does on recent Xeons): GEMMs are then
// ~5x slower, and OPENBLAS_CORETYPE fixes it.
std::string blas_core_advice();

// Per-thread scratch of at least n floats (reused across calls on the same thread).
float* scratch_f32(int slot, size_t n);

}  // namespace meshrt::kernels::host
