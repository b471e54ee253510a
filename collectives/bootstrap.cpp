#include "collectives/bootstrap.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/config_check.h"
#include "collectives/mpi_backend.h"
#include "runtime/affinity.h"
#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/thread.h"

namespace meshrt {

namespace {

int env_int(const char* name, int fallback) {
  std::string v = env_or(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  MESHRT_CHECK(end != v.c_str() && *end == '\0' && x >= 0 && x < (1L << 30),
               "environment variable " << name << "='" << v << "' is not a non-negative integer");
  return static_cast<int>(x);
}

// The launch: its placement, the transport of a process launch (kept for the backend's
// exchanges at initialisation) and the backend's factory of world communicators.
class BackendLaunch final : public Launch {
 public:
  BackendLaunch(WorldPlan plan, std::string backend, std::unique_ptr<BootstrapTransport> transport)
      : plan_(std::move(plan)), backend_(std::move(backend)), transport_(std::move(transport)) {
    plan_.transport = transport_.get();
    taken_.assign(plan_.local.size(), false);
  }
  void prepare(const CommBackend& b) { factory_ = b.prepare(plan_); }

  LaunchKind kind() const override { return plan_.kind; }
  const std::string& backend() const override { return backend_; }
  int world_size() const override { return plan_.world_size; }
  const std::vector<RankPlacement>& local() const override { return plan_.local; }

  void agree_checks(const std::string& err) override {
    if (transport_ == nullptr) return Launch::agree_checks(err);
    const std::vector<std::string> all = transport_->all_gather("checks", err);
    if (!err.empty()) throw AgreedError(err);
    for (size_t r = 0; r < all.size(); ++r)
      if (!all[r].empty()) throw AgreedError("rank " + std::to_string(r) + ": " + all[r]);
  }

  std::unique_ptr<Communicator> world(int i) override {
    const int n = static_cast<int>(plan_.local.size());
    MESHRT_CHECK(i >= 0 && i < n, "Launch::world(" << i << "): this process runs " << n
                                                   << (n == 1 ? " rank (index 0)" : " ranks")
                                                   << " (indices 0.." << n - 1 << ")");
    {
      std::lock_guard<std::mutex> lk(mu_);
      MESHRT_CHECK(!taken_[static_cast<size_t>(i)], "Launch::world(" << i << ") was already taken");
      taken_[static_cast<size_t>(i)] = true;
    }
    return factory_(i);
  }

 private:
  WorldPlan plan_;
  std::string backend_;
  std::unique_ptr<BootstrapTransport> transport_;
  WorldFactory factory_;
  std::mutex mu_;
  std::vector<bool> taken_;
};

// Local rank and size from everyone's node identity (detail::node_identity: the host name, or
// MESHRT_NODE_ID): ranks with equal identities are one node.
void local_from_nodes(const std::vector<std::string>& ids, RankPlacement* p) {
  int before = 0, same = 0;
  for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
    if (ids[static_cast<size_t>(r)] != ids[static_cast<size_t>(p->rank)]) continue;
    ++same;
    if (r < p->rank) ++before;
  }
  p->local_rank = before;
  p->local_size = same;
}

// The rendezvous of torchrun-style processes: MESHRT_RENDEZVOUS (file:///dir or
// tcp://host:port), else torchrun's MASTER_ADDR / MASTER_PORT.
std::unique_ptr<BootstrapTransport> env_transport(int rank, int world, double timeout_s) {
  const std::string dir = rendezvous_dir_from_env();
  if (!dir.empty()) return make_file_transport(dir, rank, world, timeout_s);
  std::string host;
  int port = 0;
  MESHRT_CHECK(rendezvous_tcp_from_env(&host, &port),
               "RANK/WORLD_SIZE are set (torchrun-style launch of "
                   << world
                   << " processes) but neither MASTER_ADDR / MASTER_PORT nor MESHRT_RENDEZVOUS "
                      "is: set MASTER_ADDR and MASTER_PORT (rank 0's host and a free port), or "
                      "MESHRT_RENDEZVOUS=file:///shared/dir, or launch with mpirun / srun");
  // A wait of 0 (the watchdog disabled) would give up at once: wait as long as it takes.
  return make_tcp_transport(host, port, rank, world, timeout_s > 0 ? timeout_s : 1e9);
}

// A process rank's device: from a list, the entry of its local rank; "cuda" means
// cuda:<local rank>; "cpu" (or "cpu:N") means the CPU.
Device process_device(const std::string& spec, int local_rank, bool defaulted) {
  if (spec == "cuda") return Device::cuda(local_rank);
  std::vector<Device> ds = parse_devices(spec);
  MESHRT_CHECK(!ds.front().is_cpu() || ds.size() == 1 || defaulted,
               "--devices " << spec << ": this is one process of a multi-process launch (mpirun, "
                            << "srun or RANK / WORLD_SIZE), which runs one rank per process; use "
                            << "--devices cpu and start " << ds.size() << " processes (mpirun -np "
                            << ds.size() << "), or run without the "
                            << "launcher for " << ds.size() << " ranks as threads");
  if (ds.front().is_cpu()) return Device::cpu(0);
  return ds[static_cast<size_t>(local_rank) % ds.size()];
}

}  // namespace

std::string rendezvous_dir_from_env() {
  std::string v = env_or("MESHRT_RENDEZVOUS");
  if (v.empty() || v.rfind("tcp://", 0) == 0) return "";
  const std::string scheme = "file://";
  MESHRT_CHECK(v.rfind(scheme, 0) == 0 && v.size() > scheme.size(),
               "MESHRT_RENDEZVOUS='" << v
                                     << "' is not supported: use file:///path/to/shared/dir "
                                        "(a directory every rank can read and write) or "
                                        "tcp://host:port (rank 0's address)");
  return v.substr(scheme.size());
}

namespace {

int port_number(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const long p = std::strtol(s.c_str(), &end, 10);
  MESHRT_CHECK(!s.empty() && *end == '\0' && p >= 1 && p <= 65535,
               what << ": '" << s << "' is not a TCP port (1..65535)");
  return static_cast<int>(p);
}

}  // namespace

bool rendezvous_tcp_from_env(std::string* host, int* port) {
  const std::string v = env_or("MESHRT_RENDEZVOUS");
  if (v.rfind("tcp://", 0) == 0) {
    const std::string hp = v.substr(6);
    const size_t colon = hp.rfind(':');
    MESHRT_CHECK(colon != std::string::npos && colon > 0,
                 "MESHRT_RENDEZVOUS='" << v << "': use tcp://host:port (rank 0's address)");
    *host = hp.substr(0, colon);
    *port = port_number(hp.substr(colon + 1), "MESHRT_RENDEZVOUS='" + v + "'");
    return true;
  }
  if (!v.empty()) return false;  // file://, or refused by rendezvous_dir_from_env
  const std::string addr = env_or("MASTER_ADDR"), mport = env_or("MASTER_PORT");
  if (addr.empty() || mport.empty()) return false;
  // MASTER_PORT is torch's own store (torchrun's agent, or init_process_group on rank 0):
  // meshrt's rendezvous listens on the next port.
  const int p = port_number(mport, "MASTER_PORT");
  MESHRT_CHECK(p < 65535, "MASTER_PORT=" << p
                                         << ": meshrt listens on MASTER_PORT + 1, which is not a "
                                            "port; use a lower MASTER_PORT or MESHRT_RENDEZVOUS="
                                            "tcp://host:port");
  *host = addr;
  *port = p + 1;
  return true;
}

namespace {

// Whether the environment launches this process as one rank (torchrun, or RANK and WORLD_SIZE set
// by hand). One of the two alone is refused, as torch's env:// does: the process would otherwise
// run as a whole world of threads while its peers wait for it.
bool env_launched() {
  const bool rank = !env_or("RANK").empty(), size = !env_or("WORLD_SIZE").empty();
  MESHRT_CHECK(rank == size,
               (rank ? "RANK=" + env_or("RANK") + " is set but WORLD_SIZE is not"
                     : "WORLD_SIZE=" + env_or("WORLD_SIZE") + " is set but RANK is not")
                   << ": a process started as one rank needs both (torchrun sets "
                      "both); set the other, or unset it to run the ranks as threads "
                      "of this process (--devices cpu:N)");
  // The rendezvous serves processes started as one rank each: without them it would be ignored.
  MESHRT_CHECK(rank || env_or("MESHRT_RENDEZVOUS").empty(),
               "MESHRT_RENDEZVOUS=" << env_or("MESHRT_RENDEZVOUS")
                                    << " would be ignored: it is the rendezvous of processes "
                                       "started as one rank each, and RANK / WORLD_SIZE are not "
                                       "set; set both (torchrun does), or unset MESHRT_RENDEZVOUS "
                                       "to run the ranks as threads of this process");
  return rank;
}

}  // namespace

namespace detail {

void check_process_config_early(double timeout_s) {
  if (!process_config_unchecked()) return;
  std::unique_ptr<BootstrapTransport> t;
  if (mpi_launched()) {
    t = mpi_backend().make_transport(timeout_s, "MESHRT_COMM_TIMEOUT");
  } else if (env_launched()) {
    const int rank = env_int("RANK", 0), size = env_int("WORLD_SIZE", 1);
    std::string host;
    int port = 0;
    if (size > 1 && size <= kMaxProcessRanks && rank >= 0 && rank < size &&
        (!rendezvous_dir_from_env().empty() || rendezvous_tcp_from_env(&host, &port)))
      t = env_transport(rank, size, timeout_s);
  }
  if (t) check_process_config(*t);
}

}  // namespace detail

std::unique_ptr<Launch> bootstrap(const LaunchOptions& opts) {
  const std::string spec = opts.devices.empty() ? "cpu" : opts.devices;
  const bool cuda = spec.rfind("cuda", 0) == 0;
  if (cuda) {
    std::string why;
    MESHRT_CHECK(cuda_available(&why), "--devices " << spec << ": CUDA is unavailable (" << why
                                                    << "); use --devices cpu:N instead");
  }
  WorldPlan plan;
  plan.config = opts.config;
  std::unique_ptr<BootstrapTransport> transport;
  if (mpi_launched()) {
    transport = detail::mpi_backend().make_transport(opts.config.timeout_s,
                                                     opts.config.timeout_setting.c_str());
    // Processes parse their own command lines: refuse ranks started differently before they
    // pick devices or run mismatched collectives.
    detail::check_process_config(*transport);
    RankPlacement p;
    p.rank = transport->rank();
    p.world_size = transport->size();
    local_from_nodes(transport->all_gather("hosts", detail::node_identity()), &p);
    p.device = process_device(spec, p.local_rank, opts.devices_defaulted);
    plan.kind = LaunchKind::MpiProcesses;
    plan.local.push_back(p);
  } else if (env_launched()) {
    RankPlacement p;
    p.rank = env_int("RANK", 0);
    p.world_size = env_int("WORLD_SIZE", 1);
    // Bounded before the rendezvous sizes its tables by the world (2^30 ran out of memory).
    MESHRT_CHECK(p.world_size >= 1 && p.world_size <= kMaxProcessRanks,
                 "WORLD_SIZE=" << p.world_size << " is outside 1.." << kMaxProcessRanks
                               << ": set it to the number of processes of the world");
    MESHRT_CHECK(p.rank < p.world_size, "RANK=" << p.rank
                                                << " is outside WORLD_SIZE=" << p.world_size
                                                << ": set RANK to 0 .. WORLD_SIZE-1");
    if (p.world_size > 1) transport = env_transport(p.rank, p.world_size, opts.config.timeout_s);
    if (transport) {
      detail::check_process_config(*transport);
      // The node layout from the host names (it decides which ranks may share memory);
      // LOCAL_RANK, when given, still picks the device.
      local_from_nodes(transport->all_gather("hosts", detail::node_identity()), &p);
    }
    if (!env_or("LOCAL_RANK").empty()) {
      p.local_rank = env_int("LOCAL_RANK", 0);
      if (!transport) p.local_size = env_int("LOCAL_WORLD_SIZE", std::max(1, p.local_rank + 1));
    }
    p.device = process_device(spec, p.local_rank, opts.devices_defaulted);
    plan.kind = LaunchKind::EnvProcesses;
    plan.local.push_back(p);
  } else {
    plan.kind = LaunchKind::Threads;
    const std::vector<Device> devices = parse_devices(spec);
    const int n = static_cast<int>(devices.size());
    for (int i = 0; i < n; ++i) {
      RankPlacement p;
      p.rank = i;
      p.world_size = n;
      p.local_rank = i;
      p.local_size = n;
      p.device = devices[static_cast<size_t>(i)];
      plan.local.push_back(p);
    }
  }
  plan.world_size = plan.local[0].world_size;
  plan.device_type = plan.local[0].device.type;
  const CommBackend& b = choose_collective_backend(opts.backend, plan);
  if (plan.kind != LaunchKind::Threads) set_log_rank(plan.local[0].rank, plan.world_size);
  auto launch = std::make_unique<BackendLaunch>(std::move(plan), b.name, std::move(transport));
  launch->prepare(b);
  return launch;
}

void Launch::agree_checks(const std::string& err) {
  if (!err.empty()) throw AgreedError(err);
}

void Launch::run(const std::function<void(const RankPlacement&, Communicator&)>& fn) {
  const int n = static_cast<int>(local().size());
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(n));
  std::mutex mu;
  std::exception_ptr first;
  std::string first_msg;
  auto body = [&](int i) {
    const RankPlacement& p = local()[static_cast<size_t>(i)];
    set_log_rank(p.rank, p.world_size);
    try {
      comms[static_cast<size_t>(i)] = world(i);
      fn(p, *comms[static_cast<size_t>(i)]);
    } catch (const std::exception& e) {
      bool was_first = false;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (!first) {
          first = std::current_exception();
          was_first = true;
        }
      }
      const std::string msg = error_message(e);  // the source location only at debug level
      // The cause is reported once: by the caller that catches the rethrown error (the CLI's
      // exit message), by the stuck-rank exit below, or, under mpirun, by the process abort
      // that the communicator's abort starts (mpi_process_abort).
      if (was_first) {
        std::lock_guard<std::mutex> lk(mu);
        first_msg = msg;
      }
      MESHRT_LOG_DEBUG("rank " << p.rank << " failed: " << msg);
      // An error every rank raises at the same point leaves no rank waiting: not a fault, so no
      // abort (which would write flight records and, under mpirun, abort the job).
      if (dynamic_cast<const AgreedError*>(&e) != nullptr) return;
      if (comms[static_cast<size_t>(i)]) {
        comms[static_cast<size_t>(i)]->abort("rank " + std::to_string(p.rank) + " failed: " + msg);
      }
    }
  };
  if (n == 1) {
    body(0);
  } else {
    // Threads: once a rank failed (and so aborted the world), the others get kAbortGraceS to
    // return. A rank stuck outside collectives (in compute, or stopped by an injected fault)
    // never notices the abort; then the process ends here, naming the cause once, rather than
    // waiting forever (under mpirun the same job ends through MPI_Abort).
    constexpr double kAbortGraceS = 3.0;
    std::atomic<int> running{n};
    std::vector<std::atomic<bool>> done(static_cast<size_t>(n));
    // Each rank thread on its own cores (MESHRT_HOST_BIND); what it starts inherits them. No rank
    // runs before every rank thread exists: one the system refuses ends the launch with that
    // error, the others never started their work.
    const std::vector<cpu_set_t> cores = rank_core_sets(n);
    std::vector<std::thread> threads = start_threads(
        n,
        [&](int i) {
          if (!cores.empty())
            bind_this_thread(cores[static_cast<size_t>(i)], local()[static_cast<size_t>(i)].rank);
          body(i);
          done[static_cast<size_t>(i)].store(true);
          running.fetch_sub(1);
        },
        "the ranks", "lower --devices or raise ulimit -u / ulimit -v");
    std::optional<std::chrono::steady_clock::time_point> failed_at;
    while (running.load() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bool failed = false;
      {
        std::lock_guard<std::mutex> lk(mu);
        failed = first != nullptr;
      }
      if (!failed) continue;
      const auto now = std::chrono::steady_clock::now();
      if (!failed_at) failed_at = now;
      if (std::chrono::duration<double>(now - *failed_at).count() < kAbortGraceS) continue;
      std::vector<int> stuck;
      for (int i = 0; i < n; ++i) {
        if (!done[static_cast<size_t>(i)].load())
          stuck.push_back(local()[static_cast<size_t>(i)].rank);
      }
      // The one report of the cause: the error is not rethrown from here.
      std::string cause;
      {
        std::lock_guard<std::mutex> lk(mu);
        cause = first_msg;
      }
      std::fprintf(stderr,
                   "meshrt: error: %s\nmeshrt: %s did not return within %.0f s of the abort "
                   "(stuck outside a collective); exiting without cleanup\n",
                   cause.c_str(), detail::format_ranks(stuck).c_str(), kAbortGraceS);
      std::fflush(stderr);
      std::_Exit(1);
    }
    for (auto& t : threads) t.join();
  }
  if (first) std::rethrow_exception(first);
}

std::string Launch::describe() const {
  std::ostringstream os;
  os << world_size() << (world_size() == 1 ? " rank" : " ranks");
  if (kind() == LaunchKind::Threads) {
    os << " as threads of this process";
  } else {
    os << " as processes (" << launch_kind_name(kind()) << "; this is rank " << local()[0].rank
       << ", local rank " << local()[0].local_rank << " of " << local()[0].local_size << ")";
  }
  os << ", " << backend() << " backend";
  return os.str();
}

}  // namespace meshrt
