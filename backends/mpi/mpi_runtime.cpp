#include "backends/mpi/mpi_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>

#include "backends/mpi/mpi_check.h"
#include "backends/mpi/mpi_process.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/flight.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/stop.h"
#include "runtime/thread.h"

namespace meshrt {

namespace detail {

[[noreturn]] void mpi_fail(const char* call, int rc, const char* file, int line) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  int cls = rc;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    MPI_Error_class(rc, &cls);
    MPI_Error_string(rc, buf, &len);
  } else {
    std::snprintf(buf, sizeof(buf), "MPI error %d", rc);
    len = static_cast<int>(std::strlen(buf));
  }
  const char* base = std::strrchr(file, '/');
  throw CommError(std::string(call) + " failed: " + std::string(buf, static_cast<size_t>(len)) +
                  " (MPI error class " + std::to_string(cls) + ") [" + (base ? base + 1 : file) +
                  ":" + std::to_string(line) + "]");
}

MpiProcess& mpi_process() {
  static MpiProcess* p = new MpiProcess;  // leaked on purpose: the exit handler uses it
  return *p;
}

void mpi_process_abort(const std::string& why) {
  MpiProcess& p = mpi_process();
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(p.mu);
    if (!p.aborted.load()) {
      p.reason = why;
      p.aborted.store(true);
      first = true;
      MESHRT_LOG_ERROR("MPI communicators aborted: " << why);
    }
  }
  if (first) flight_dump_all(why);
}

std::string mpi_abort_reason() {
  MpiProcess& p = mpi_process();
  std::lock_guard<std::mutex> lk(p.mu);
  return p.reason;
}

void mpi_bury(std::shared_ptr<void> buffers) {
  MpiProcess& p = mpi_process();
  std::lock_guard<std::mutex> lk(p.mu);
  p.graveyard.push_back(std::move(buffers));
}

bool mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void mpi_setup_watch_window() {
  MpiProcess& p = mpi_process();
  if (p.node_comm != MPI_COMM_NULL) return;
  try {
    MESHRT_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &p.node_comm));
    MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(p.node_comm, MPI_ERRORS_RETURN));
    int nl = 0, me = 0, world = 0, wrank = 0;
    MESHRT_MPI_CHECK(MPI_Comm_size(p.node_comm, &nl));
    MESHRT_MPI_CHECK(MPI_Comm_rank(p.node_comm, &me));
    MESHRT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MESHRT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &wrank));
    uint64_t* base = nullptr;
    MESHRT_MPI_CHECK(
        MPI_Win_allocate_shared(static_cast<MPI_Aint>(kMpiWatchSlots * sizeof(uint64_t)),
                                sizeof(uint64_t), MPI_INFO_NULL, p.node_comm, &base, &p.win));
    std::memset(base, 0, kMpiWatchSlots * sizeof(uint64_t));
    p.node_words.assign(static_cast<size_t>(nl), nullptr);
    for (int i = 0; i < nl; ++i) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* ptr = nullptr;
      MESHRT_MPI_CHECK(MPI_Win_shared_query(p.win, i, &sz, &disp, &ptr));
      p.node_words[static_cast<size_t>(i)] = static_cast<uint64_t*>(ptr);
    }
    std::vector<int> node_world(static_cast<size_t>(nl));
    MESHRT_MPI_CHECK(MPI_Allgather(&wrank, 1, MPI_INT, node_world.data(), 1, MPI_INT, p.node_comm));
    p.world_to_node.assign(static_cast<size_t>(world), -1);
    for (int i = 0; i < nl; ++i)
      p.world_to_node[static_cast<size_t>(node_world[static_cast<size_t>(i)])] = i;
    p.my_node_index = me;
  } catch (const std::exception& e) {
    // Without shared windows the watchdog still works; it just cannot name missing ranks.
    MESHRT_LOG_WARN("MPI watchdog: no node-shared window (" << e.what()
                                                            << "); timeouts will not name ranks");
    p.node_words.clear();
    p.world_to_node.clear();
  }
}

namespace {

uint64_t steady_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

constexpr uint64_t kGaveUp = ~uint64_t{0};
constexpr uint64_t kStaleNs = 1000000000ull;  // a waiting rank polls far more often than this

}  // namespace

MpiWaitMark::MpiWaitMark() {
  MpiProcess& p = mpi_process();
  if (p.my_node_index < 0 || p.node_words.empty()) return;
  words_ = p.node_words[static_cast<size_t>(p.my_node_index)];
  __atomic_store_n(&words_[kMpiBeatSlot], steady_ns(), __ATOMIC_RELEASE);
  __atomic_fetch_add(&words_[kMpiBusySlot], 1, __ATOMIC_ACQ_REL);
}

MpiWaitMark::~MpiWaitMark() {
  if (!words_) return;
  if (finished_) {
    __atomic_fetch_sub(&words_[kMpiBusySlot], 1, __ATOMIC_ACQ_REL);
  } else {
    __atomic_store_n(&words_[kMpiBeatSlot], kGaveUp, __ATOMIC_RELEASE);
  }
}

void MpiWaitMark::beat() {
  if (!words_) return;
  const uint64_t last = __atomic_load_n(&words_[kMpiBeatSlot], __ATOMIC_RELAXED);
  if (last != kGaveUp) __atomic_store_n(&words_[kMpiBeatSlot], steady_ns(), __ATOMIC_RELEASE);
}

std::string mpi_rank_activity(int node_index) {
  MpiProcess& p = mpi_process();
  if (node_index < 0 || static_cast<size_t>(node_index) >= p.node_words.size()) return "unknown";
  const uint64_t* w = p.node_words[static_cast<size_t>(node_index)];
  const uint64_t busy = __atomic_load_n(&w[kMpiBusySlot], __ATOMIC_ACQUIRE);
  const uint64_t beat = __atomic_load_n(&w[kMpiBeatSlot], __ATOMIC_ACQUIRE);
  if (beat == kGaveUp) return "gave up after an abort";
  if (busy == 0) return "not inside any collective";
  if (steady_ns() - beat > kStaleNs) return "not responding inside a collective";
  return "waiting in another collective";
}

std::vector<int> mpi_stalled_ranks() {
  MpiProcess& p = mpi_process();
  std::vector<int> out;
  for (size_t w = 0; w < p.world_to_node.size(); ++w) {
    const int ni = p.world_to_node[w];
    if (ni < 0 || ni == p.my_node_index) continue;
    const std::string a = mpi_rank_activity(ni);
    if (a == "not inside any collective" || a == "not responding inside a collective") {
      out.push_back(static_cast<int>(w));
    }
  }
  return out;
}

int mpi_int_count(int64_t n, const char* what) {
  MESHRT_CHECK(n <= INT_MAX, what << ": " << n << " elements exceed MPI's int count limit "
                                  << INT_MAX << "; split the tensor");
  return static_cast<int>(n);
}

}  // namespace detail

namespace {

// While MPI_Init runs: ends the process when it takes longer than the communicator timeout
// (MESHRT_COMM_TIMEOUT; 0: never) or when a stop was requested (SIGINT / SIGTERM under
// StopSignals, which would otherwise wait for a step that never comes), saying why.
class InitWatch {
 public:
  explicit InitWatch(double timeout_s)
      : thread_(start_thread(
            [this, timeout_s] {
              const auto start = std::chrono::steady_clock::now();
              std::unique_lock<std::mutex> lk(mu_);
              while (!done_) {
                cv_.wait_for(lk, std::chrono::milliseconds(50));
                if (done_) return;
                const double waited =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                if (const int sig = stop_request()) {
                  std::fprintf(stderr,
                               "meshrt: stopped by signal %d while MPI_Init waited for the "
                               "job's other processes\n",
                               sig);
                  std::fflush(stderr);
                  _exit(128 + sig);
                }
                if (timeout_s > 0 && waited > timeout_s) {
                  std::fprintf(
                      stderr,
                      "meshrt: MPI_Init did not complete within %.0f s (MESHRT_COMM_TIMEOUT): "
                      "it waits for every process of the job; did each one start meshrt "
                      "with a command that runs ranks (not --help, info or another "
                      "program)?\n",
                      timeout_s);
                  std::fflush(stderr);
                  _exit(1);
                }
              }
            },
            "the thread watching MPI_Init", "raise ulimit -u / ulimit -v")) {}
  ~InitWatch() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  InitWatch(const InitWatch&) = delete;
  InitWatch& operator=(const InitWatch&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

}  // namespace

void mpi_init() {
  detail::MpiProcess& p = detail::mpi_process();
  std::lock_guard<std::mutex> lk(p.mu);
  int init = 0;
  MPI_Initialized(&init);
  if (init) {
    int fin = 0;
    MPI_Finalized(&fin);
    MESHRT_CHECK(!fin, "MPI was already finalised; meshrt cannot use it any more");
    int level = 0;
    MESHRT_MPI_CHECK(MPI_Query_thread(&level));
    MESHRT_CHECK(level == MPI_THREAD_MULTIPLE,
                 "MPI was initialised with thread level "
                     << level << "; meshrt issues MPI calls from stream threads and needs "
                     << "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
    return;
  }
  int provided = 0;
  {
    // MPI_Init waits inside the MPI library for every process of the job, with no timeout and
    // deaf to signals the process handles: a process of the job that never initialises (one
    // started with --help, or another program) would hold the others there for good.
    InitWatch watch(CommConfig::from_env().timeout_s);
    MESHRT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  }
  MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MESHRT_CHECK(provided == MPI_THREAD_MULTIPLE, "this MPI library provides thread level "
                                                    << provided
                                                    << ", meshrt needs MPI_THREAD_MULTIPLE");
  p.we_initialized = true;
  std::atexit([] { mpi_finalize(); });
}

void mpi_finalize() {
  detail::MpiProcess& p = detail::mpi_process();
  {
    std::lock_guard<std::mutex> lk(p.mu);
    if (!p.we_initialized || p.finalized || !detail::mpi_live()) return;
    p.finalized = true;
  }
  if (p.aborted.load()) {
    // Peers may be blocked inside MPI waiting for us: end the whole job, non-zero.
    // The cause was logged when the communicators were aborted (mpi_process_abort).
    std::fprintf(stderr, "meshrt: aborting the MPI job after the communicator failure above\n");
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
  }
  if (p.win != MPI_WIN_NULL) MPI_Win_free(&p.win);
  if (p.node_comm != MPI_COMM_NULL) MPI_Comm_free(&p.node_comm);
  MPI_Finalize();
}

int mpi_world_rank() {
  mpi_init();
  int r = 0;
  MESHRT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int mpi_world_size() {
  mpi_init();
  int s = 0;
  MESHRT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &s));
  return s;
}

namespace {

// The bootstrap all-gather over MPI_COMM_WORLD: lengths first, then the blobs.
class MpiTransport final : public BootstrapTransport {
 public:
  MpiTransport(double timeout_s, const char* timeout_setting)
      : timeout_s_(timeout_s), timeout_setting_(timeout_setting) {
    mpi_init();
    rank_ = mpi_world_rank();
    size_ = mpi_world_size();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::string> all_gather(const std::string& key, const std::string& mine) override {
    const detail::Deadline dl = detail::Deadline::after(timeout_s_);
    auto lens = std::make_shared<std::vector<int>>(static_cast<size_t>(size_) + 1);
    (*lens)[static_cast<size_t>(size_)] =
        detail::mpi_int_count(static_cast<int64_t>(mine.size()), "bootstrap all-gather");
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Iallgather(lens->data() + size_, 1, MPI_INT, lens->data(), 1, MPI_INT,
                                    MPI_COMM_WORLD, &req));
    wait(&req, key, mine.size(), dl, lens);
    auto displs = std::make_shared<std::vector<int>>(static_cast<size_t>(size_));
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      (*displs)[static_cast<size_t>(r)] =
          detail::mpi_int_count(total, "bootstrap all-gather (total bytes)");
      total += (*lens)[static_cast<size_t>(r)];
    }
    detail::mpi_int_count(total, "bootstrap all-gather (total bytes)");
    auto bufs = std::make_shared<std::pair<std::string, std::vector<char>>>(
        mine, std::vector<char>(static_cast<size_t>(total)));
    MESHRT_MPI_CHECK(MPI_Iallgatherv(bufs->first.data(), static_cast<int>(mine.size()), MPI_BYTE,
                                     bufs->second.data(), lens->data(), displs->data(), MPI_BYTE,
                                     MPI_COMM_WORLD, &req));
    wait(&req, key, mine.size(), dl,
         std::make_shared<std::tuple<decltype(lens), decltype(displs), decltype(bufs)>>(
             lens, displs, bufs));
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) {
      out.emplace_back(bufs->second.data() + (*displs)[static_cast<size_t>(r)],
                       static_cast<size_t>((*lens)[static_cast<size_t>(r)]));
    }
    return out;
  }

 private:
  void wait(MPI_Request* req, const std::string& key, size_t bytes, const detail::Deadline& dl,
            std::shared_ptr<void> keep) {
    int done = 0;
    for (;;) {
      MESHRT_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (dl.passed()) {
        std::string msg = "bootstrap: exchanging '" + key + "' (" + std::to_string(bytes) +
                          " bytes from this rank) between all MPI ranks did not complete within " +
                          std::to_string(timeout_s_) + " s (" + timeout_setting_ + ")";
        detail::mpi_process_abort(msg);
        detail::mpi_bury(std::move(keep));
        throw CommError(msg);
      }
      sched_yield();
    }
  }

  double timeout_s_;
  std::string timeout_setting_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<BootstrapTransport> make_mpi_transport(double timeout_s,
                                                       const char* timeout_setting) {
  return std::make_unique<MpiTransport>(timeout_s, timeout_setting);
}

}  // namespace meshrt
