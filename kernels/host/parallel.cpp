#include "kernels/host/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels/deterministic.h"
#include "kernels/ops.h"
#include "runtime/affinity.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/thread.h"

namespace meshrt::kernels::host {

struct ThreadPool::Job {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t ntasks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;

  // Runs tasks until none are left; returns whether it ran any.
  bool work() {
    bool any = false;
    for (;;) {
      int64_t t = next.fetch_add(1, std::memory_order_relaxed);
      if (t >= ntasks) break;
      any = true;
      try {
        (*fn)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == ntasks) {
        std::lock_guard<std::mutex> lk(mu);
        cv.notify_all();
      }
    }
    return any;
  }
};

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  int helpers = threads_ - 1;
  int world = log_world();
  int rank = log_rank();
  workers_ = start_threads(
      helpers,
      [this, rank, world](int) {
        set_log_rank(rank, world);
        worker_loop();
      },
      "the host thread pool", "lower MESHRT_HOST_THREADS or raise ulimit -u / ulimit -v");
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_
      job = jobs_.front();
    }
    if (!job->work()) {
      // Exhausted: drop it from the queue so the next job is picked up.
      std::lock_guard<std::mutex> lk(mu_);
      if (!jobs_.empty() && jobs_.front() == job) jobs_.pop_front();
    }
  }
}

void ThreadPool::run(int64_t ntasks, const std::function<void(int64_t)>& fn) {
  if (ntasks <= 0) return;
  if (ntasks == 1 || workers_.empty()) {
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->ntasks = ntasks;
  {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(job);
  }
  if (ntasks - 1 >= static_cast<int64_t>(workers_.size())) {
    cv_.notify_all();
  } else {
    for (int64_t i = 0; i < ntasks - 1; ++i) cv_.notify_one();
  }
  job->work();
  {
    std::unique_lock<std::mutex> lk(job->mu);
    job->cv.wait(lk, [&] { return job->done.load(std::memory_order_acquire) == ntasks; });
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = std::find(jobs_.begin(), jobs_.end(), job);
    if (it != jobs_.end()) jobs_.erase(it);
  }
  if (job->error) std::rethrow_exception(job->error);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = static_cast<int64_t>(threads_) * 4;
  int64_t chunks = std::min<int64_t>(max_chunks, (n + grain - 1) / grain);
  if (chunks <= 1 || threads_ == 1) {
    fn(0, n);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  run(chunks, [&](int64_t c) {
    int64_t b = c * per;
    int64_t e = std::min(n, b + per);
    fn(b, e);
  });
}

int usable_cores() {
  if (const size_t n = thread_cores().size(); n > 0) return static_cast<int>(n);
  unsigned h = std::thread::hardware_concurrency();
  return h > 0 ? static_cast<int>(h) : 1;
}

namespace {
int threads_for(const Context& ctx) {
  if (const int64_t v = env_int("MESHRT_HOST_THREADS", 0); v > 0) return static_cast<int>(v);
  // A rank bound to its own cores (runtime/affinity.h) uses all of them.
  const int mine = usable_cores();
  if (mine < static_cast<int>(process_cores().size())) return mine;
  int ranks = std::max(1, ctx.local_ranks());
  return std::max(1, usable_cores() / ranks);
}
}  // namespace

ThreadPool& pool(Context& ctx) {
  return ctx.state<ThreadPool>([&ctx] {
    int n = threads_for(ctx);
    MESHRT_LOG_DEBUG("kernels: host pool of " << n << " threads (" << usable_cores() << " cores, "
                                              << ctx.local_ranks() << " local ranks)");
    return std::make_shared<ThreadPool>(n);
  });
}

std::string blas_core_advice() {
  const char* core = openblas_get_corename();
  std::string c = core ? core : "";
  const bool old_core = c == "Prescott" || c == "Core2" || c == "Penryn" || c == "Dunnington" ||
                        c == "Nehalem" || c == "Atom" || c == "Katmai" || c == "Coppermine" ||
                        c == "Northwood" || c == "Banias" || c == "Yonah";
  if (!old_core) return {};
  const char* want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (!want) return {};
  return "OpenBLAS chose its '" + c + "' kernels but this CPU has " +
         (std::string(want) == "SkylakeX" ? "AVX-512" : "AVX2") +
         " (OpenBLAS's CPU table predates it): GEMMs run several times slower than they can; set "
         "OPENBLAS_CORETYPE=" +
         want + " in the environment";
}

void ensure_blas_single_threaded() {
  static std::once_flag advice_once;
  std::call_once(advice_once, [] {
    std::string a = blas_core_advice();
    if (!a.empty()) MESHRT_LOG_WARN("kernels: " << a);
  });
  static std::mutex mu;
  if (openblas_get_num_threads() != 1) {
    std::lock_guard<std::mutex> lk(mu);
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  }
}

namespace {
struct DeterministicGemm {
  std::atomic<bool> on{false};
};
DeterministicGemm& deterministic_gemm(Context& ctx) {
  return ctx.state<DeterministicGemm>([] { return std::make_shared<DeterministicGemm>(); });
}
}  // namespace

bool gemm_deterministic(Context& ctx) { return deterministic_gemm(ctx).on.load(); }

int gemm_plan_threads(Context& ctx) {
  return deterministic_gemm(ctx).on.load() ? ops::kDeterministicGemmThreads : pool(ctx).size();
}

float* scratch_f32(int slot, size_t n) {
  constexpr int kSlots = 8;
  thread_local std::vector<float> bufs[kSlots];
  MESHRT_CHECK(slot >= 0 && slot < kSlots, "scratch slot " << slot << " out of range");
  auto& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace meshrt::kernels::host

namespace meshrt::ops {
int host_threads(Context& ctx) { return kernels::host::pool(ctx).size(); }
void set_deterministic_gemm(Context& ctx, bool on) {
  kernels::host::deterministic_gemm(ctx).on.store(on);
}
}  // namespace meshrt::ops
