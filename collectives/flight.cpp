#include "collectives/flight.h"

#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "runtime/dtype.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/stop.h"
#include "runtime/thread.h"

namespace meshrt::detail {

const char* flight_state_name(FlightState s) {
  switch (s) {
    case FlightState::Issued:
      return "issued";
    case FlightState::Started:
      return "started";
    case FlightState::Completed:
      return "completed";
    case FlightState::Failed:
      return "failed";
    case FlightState::Skipped:
      return "skipped";
  }
  return "?";
}

int64_t flight_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t FlightRing::issue(const FlightEntry& e) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_++;
  FlightEntry& s = slots_[id % slots_.size()];
  s = e;
  s.id = id;
  return id;
}

FlightEntry* FlightRing::find(uint64_t id) {
  FlightEntry& s = slots_[id % slots_.size()];
  return s.id == id ? &s : nullptr;
}

void FlightRing::started(uint64_t id) {
  const int64_t t = flight_now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  if (FlightEntry* e = find(id)) {
    e->start_ns = t;
    if (e->state == FlightState::Issued) e->state = FlightState::Started;
  }
}

void FlightRing::ended(uint64_t id, bool ok) {
  const int64_t t = flight_now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  if (FlightEntry* e = find(id)) {
    e->end_ns = t;
    e->state = ok ? FlightState::Completed : FlightState::Failed;
  }
}

int64_t FlightRing::oldest_open_ns() const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t oldest = 0;
  for (const FlightEntry& e : slots_) {
    // NCCL entries stay "issued" (their completion lives in CUDA events): not counted.
    if (e.id == 0 || backend_ == "nccl") continue;
    // Started: running and waiting for peers (an issued call may just queue behind compute).
    if (e.state != FlightState::Started) continue;
    if (oldest == 0 || e.start_ns < oldest) oldest = e.start_ns;
  }
  return oldest;
}

void FlightRing::data_bad(uint64_t id, const std::vector<int>& group_ranks) {
  std::lock_guard<std::mutex> lk(mu_);
  if (FlightEntry* e = find(id)) {
    for (int r : group_ranks) {
      if (r >= 0 && r < 64) e->data_bad |= uint64_t{1} << r;
    }
  }
}

std::string flight_job_id(std::string_view backend) {
  // Thread ranks share this process: its host and pid name the job.
  if (backend == "host") {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "?");
    return std::string(host) + ":" + std::to_string(::getpid());
  }
  // Processes: an id their launcher gives every rank of one job alike.
  for (const char* v : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"}) {
    const char* x = std::getenv(v);
    if (!x || !*x) continue;
    std::string id(v);
    id.append("=").append(x);
    const char* step = std::getenv("SLURM_STEP_ID");
    if (std::string_view(v) == "SLURM_JOB_ID" && step && *step) id.append(".").append(step);
    return id;
  }
  return "";
}

void FlightRing::set_context(int world_size, std::string_view backend, std::string_view fault) {
  std::string job = flight_job_id(backend);
  std::lock_guard<std::mutex> lk(mu_);
  world_size_ = world_size;
  backend_ = backend;
  fault_ = fault;
  job_ = std::move(job);
}

namespace {

void json_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      os << '\\' << c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
}

std::string_view fixed(const char* s, size_t cap) { return std::string_view(s, strnlen(s, cap)); }

}  // namespace

std::string FlightRing::json(const std::string& reason) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::ostringstream os;
  os << "{\"meshrt_flight\": 1, \"rank\": " << rank_ << ", \"world_size\": " << world_size_
     << ", \"backend\": ";
  json_string(os, backend_);
  if (!job_.empty()) {
    os << ", \"job\": ";
    json_string(os, job_);
  }
  os << ", \"pid\": " << getpid() << ", \"fault\": ";
  json_string(os, fault_);
  os << ", \"reason\": ";
  json_string(os, reason);
  os << ", \"dumped_ns\": " << flight_now_ns() << ", \"capacity\": " << slots_.size()
     << ", \"recorded\": " << next_ - 1 << ",\n \"entries\": [";
  const uint64_t first = next_ > slots_.size() ? next_ - slots_.size() : 1;
  bool any = false;
  for (uint64_t id = first; id < next_; ++id) {
    const FlightEntry& e = slots_[id % slots_.size()];
    if (e.id != id) continue;
    const auto op = static_cast<CommOp>(e.op);
    os << (any ? ",\n  " : "\n  ") << "{\"id\": " << e.id << ", \"group\": ";
    json_string(os, fixed(e.group, sizeof(e.group)));
    os << ", \"gid\": \"" << std::hex << e.gid << std::dec << "\", \"group_rank\": " << e.group_rank
       << ", \"group_size\": " << e.group_size << ", \"seq\": " << e.seq << ", \"op\": \""
       << comm_op_name(op) << "\", \"dtype\": \"" << dtype_name(static_cast<DType>(e.dtype))
       << "\", \"redop\": \"" << reduce_op_name(static_cast<ReduceOp>(e.redop))
       << "\", \"count\": " << e.count << ", \"root\": " << e.root << ", \"peer\": " << e.peer
       << ", \"bytes\": " << e.bytes << ", \"stream\": ";
    json_string(os, fixed(e.stream, sizeof(e.stream)));
    os << ", \"enqueue_ns\": " << e.enqueue_ns << ", \"start_ns\": " << e.start_ns
       << ", \"end_ns\": " << e.end_ns << ", \"state\": \"" << flight_state_name(e.state)
       << "\", \"note\": ";
    json_string(os, fixed(e.note, sizeof(e.note)));
    if (e.data_bad) {
      os << ", \"data_bad\": [";
      bool more = false;
      for (int r = 0; r < 64; ++r) {
        if (e.data_bad >> r & 1) {
          os << (more ? ", " : "") << r;
          more = true;
        }
      }
      os << "]";
    }
    os << "}";
    any = true;
  }
  os << "\n ]}\n";
  return os.str();
}

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<FlightRing>> rings;
};
Registry& registry() {
  static Registry* r = new Registry;  // leaked on purpose: signal dumps may run during exit
  return *r;
}

// Signals: SIGUSR1 and fatal signals wake a dedicated thread that writes the records (a signal
// handler may not lock or allocate). A fatal signal's handler waits for it at most 2 s, then
// hands the signal to the previous handler (or the default action).
sem_t g_sem;
volatile sig_atomic_t g_pending_sig = 0;
std::atomic<int> g_dumps_done{0};
// SIGTERM too: mpirun ends the other ranks of a failed job with it.
constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM};
struct sigaction g_old[64];

void on_usr1(int sig) {
  g_pending_sig = sig;
  sem_post(&g_sem);
}

// A SIGTERM the application stops gracefully on: a record only when this process is stuck (a
// collective open for kStuckAfterNs, or a rank parked by an injected fault), as when mpirun ends
// a failed job.
constexpr int kStuckSigterm = -SIGTERM;
constexpr int64_t kStuckAfterNs = 1000LL * 1000 * 1000;
std::atomic<bool> g_parked{false};

bool stuck() {
  if (g_parked.load()) return true;
  std::vector<std::shared_ptr<FlightRing>> live;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (auto& w : r.rings)
      if (auto p = w.lock()) live.push_back(std::move(p));
  }
  const int64_t now = flight_now_ns();
  for (auto& ring : live)
    if (const int64_t t = ring->oldest_open_ns(); t > 0 && now - t >= kStuckAfterNs) return true;
  return false;
}

// An application handler of `sig` (not the default action, not ignored).
bool app_handles(const struct sigaction& old) {
  return (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                     : old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN;
}

void on_fatal(int sig, siginfo_t* info, void* ctx) {
  // SIGTERM is a request to stop, a fault only when it ends the process: when the application
  // stops gracefully on it (runtime/stop.h: meshrt train, after the step), no record is written.
  if (sig == SIGTERM && graceful_stop() && app_handles(g_old[sig])) {
    // Unless the rank is stuck (the dump thread checks: kStuckSigterm), it stops after the step.
    g_pending_sig = kStuckSigterm;
    sem_post(&g_sem);
    struct sigaction& old = g_old[sig];
    sigaction(sig, &old, nullptr);
    if (old.sa_flags & SA_SIGINFO)
      old.sa_sigaction(sig, info, ctx);
    else
      old.sa_handler(sig);
    return;
  }
  const int before = g_dumps_done.load();
  g_pending_sig = sig;
  sem_post(&g_sem);
  for (int i = 0; i < 200 && g_dumps_done.load() == before; ++i) {
    timespec ts{0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  struct sigaction& old = g_old[sig];
  sigaction(sig, &old, nullptr);
  if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) {
    old.sa_sigaction(sig, info, ctx);
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  } else {
    raise(sig);
  }
}

void install_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sem_init(&g_sem, 0, 0) != 0) return;
    const int lr = log_rank(), lw = log_world();
    // The dumps run on this thread (a signal handler only posts the semaphore). The flag is not
    // set when it cannot start: the next communicator tries again.
    std::thread dumper;
    try {
      dumper = start_thread(
          [lr, lw] {
            set_log_rank(lr, lw);
            for (;;) {
              if (sem_wait(&g_sem) != 0) continue;
              const int sig = g_pending_sig;
              if (sig == kStuckSigterm) {
                if (stuck())
                  flight_dump_all("SIGTERM while stuck (a collective open for 1 s or more)");
                continue;
              }
              const std::string why = sig == SIGUSR1 ? std::string("SIGUSR1")
                                                     : "fatal signal " + std::to_string(sig) +
                                                           " (" + strsignal(sig) + ")";
              flight_dump_all(why);
              g_dumps_done.fetch_add(1);
            }
          },
          "the flight recorder's signal thread", "raise ulimit -u / ulimit -v");
    } catch (...) {
      (void)sem_destroy(&g_sem);
      throw;
    }
    dumper.detach();
    struct sigaction sa {};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    struct sigaction prev {};
    sigaction(SIGUSR1, nullptr, &prev);
    // Leave an application's own SIGUSR1 handler alone.
    if (prev.sa_handler == SIG_DFL) sigaction(SIGUSR1, &sa, nullptr);
    for (int s : kFatal) {
      struct sigaction fa {};
      fa.sa_sigaction = on_fatal;
      // SA_RESTART as an application handler we chain to would expect (blocking calls resume).
      fa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER | SA_RESTART;
      sigemptyset(&fa.sa_mask);
      sigaction(s, &fa, &g_old[s]);
    }
  });
}

// MESHRT_FLIGHT: entries per ring (0 turns the recorder off).
size_t ring_capacity() { return static_cast<size_t>(env_int("MESHRT_FLIGHT", 512)); }

}  // namespace

std::shared_ptr<RankState> make_rank_state(int global_rank, int world_size,
                                           std::string_view backend, const std::string& fault) {
  auto st = std::make_shared<RankState>();
  st->global_rank = global_rank;
  st->threads = backend == "host";
  FaultSpec f = parse_fault_spec(fault);
  // A rank outside the world would never fire: say so at init instead.
  MESHRT_CHECK(!f.active() || f.rank < world_size,
               "MESHRT_FAULT / --fault '"
                   << fault << "' names rank " << f.rank << ", but this world has " << world_size
                   << " rank(s) (0.." << world_size - 1 << "): name a global rank below "
                   << world_size);
  if (f.active() && f.rank == global_rank) st->fault = f;
  if (const size_t cap = ring_capacity(); cap > 0) {
    st->ring = std::make_shared<FlightRing>(global_rank, cap);
    st->ring->set_context(world_size, backend, fault);
    Registry& r = registry();
    {
      std::lock_guard<std::mutex> lk(r.mu);
      // Drop rings of ranks that are gone.
      std::erase_if(r.rings, [](const std::weak_ptr<FlightRing>& w) { return w.expired(); });
      r.rings.push_back(st->ring);
    }
    install_signals();
  }
  return st;
}

void flight_mark_parked() { g_parked.store(true); }

std::string flight_job_id() {
  std::string id;
  for (const char* v : {"MESHRT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                        "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
    id = env_or(v);
    if (!id.empty()) {
      if (!std::strcmp(v, "SLURM_JOB_ID") && !env_or("SLURM_STEP_ID").empty())
        id.append(".").append(env_or("SLURM_STEP_ID"));
      break;
    }
  }
  if (id.empty()) id = "pid" + std::to_string(getpid());
  // A file name: anything but [A-Za-z0-9._-] becomes '_'.
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return id;
}

std::string flight_dir() {
  const std::string d = env_or("MESHRT_FLIGHT_DIR");
  if (!d.empty()) return d;
  return env_or("TMPDIR", "/tmp") + "/meshrt-flight-" + flight_job_id();
}

void check_flight_dir_from_env() {
  const std::string d = env_or("MESHRT_FLIGHT_DIR");
  if (d.empty()) return;
  struct stat st {};
  const bool exists = ::stat(d.c_str(), &st) == 0;
  const int err = errno;
  MESHRT_CHECK(exists && S_ISDIR(st.st_mode),
               "MESHRT_FLIGHT_DIR=" << d << ": "
                                    << (exists ? "not a directory" : std::strerror(err))
                                    << "; give an existing directory for the flight records, or "
                                       "unset it (they then go to ${TMPDIR:-/tmp}/meshrt-flight-"
                                       "<job id>)");
  MESHRT_CHECK(::access(d.c_str(), W_OK | X_OK) == 0,
               "MESHRT_FLIGHT_DIR=" << d << ": cannot write there (" << std::strerror(errno)
                                    << "); give a directory this user can write, or unset it");
}

namespace {

// Writes one record (temporary file, then rename); "" and a warning on failure.
std::string write_record(int rank, const std::string& text) {
  const std::string dir = flight_dir();
  // The default per-job folder is made on the first record (every rank of the job names the
  // same one); a MESHRT_FLIGHT_DIR the user gave must exist.
  if (env_or("MESHRT_FLIGHT_DIR").empty()) (void)mkdir(dir.c_str(), 0755);
  {
    const std::string path = dir + "/meshrt-flight-" + std::to_string(rank) + ".json";
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    bool ok = f != nullptr;
    if (f) {
      ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
      ok = (std::fclose(f) == 0) && ok;
    }
    if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) {
      const int err = errno;
      std::remove(tmp.c_str());
      MESHRT_LOG_WARN("flight recorder: cannot write " << path << ": " << std::strerror(err)
                                                       << " (set MESHRT_FLIGHT_DIR)");
      return "";
    }
    return path;
  }
}

}  // namespace

FlightRing::~FlightRing() {
  // MESHRT_FLIGHT_ON_EXIT=1: every rank's record also when its communicators are destroyed
  // (a run that ended normally, e.g. to read the skew of a slow rank).
  try {
    if (!env_switch("MESHRT_FLIGHT_ON_EXIT")) return;
    write_record(rank_, json("end of run"));
  } catch (...) {
    // a destructor: the record is lost, nothing else
  }
}

std::vector<std::string> flight_dump_all(const std::string& reason) {
  std::vector<std::shared_ptr<FlightRing>> live;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (auto& w : r.rings) {
      if (auto p = w.lock()) live.push_back(std::move(p));
    }
  }
  std::vector<std::string> written;
  const std::string dir = flight_dir();
  for (auto& ring : live) {
    std::string path = write_record(ring->rank(), ring->json(reason));
    if (!path.empty()) written.push_back(std::move(path));
  }
  if (!written.empty()) {
    MESHRT_LOG_WARN("flight recorder: wrote " << written.size() << " record"
                                              << (written.size() == 1 ? "" : "s") << " to " << dir
                                              << "; read them with `meshrt doctor`");
  }
  return written;
}

}  // namespace meshrt::detail
