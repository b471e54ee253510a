#include "collectives/bootstrap.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "collectives/comm_detail.h"
#include "collectives/host_comm.h"
#include "collectives/mpi_comm.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#if defined(MESHRT_WITH_CUDA)
#include "collectives/nccl_comm.h"
#endif

namespace meshrt {

const char* launch_kind_name(LaunchKind k) {
  switch (k) {
    case LaunchKind::Threads:
      return "threads";
    case LaunchKind::MpiProcesses:
      return "mpi-processes";
    case LaunchKind::EnvProcesses:
      return "env-processes";
  }
  return "?";
}

namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback) {
  std::string v = env_or(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  MESHRT_CHECK(end != v.c_str() && *end == '\0' && x >= 0 && x < (1L << 30),
               "environment variable " << name << "='" << v << "' is not a non-negative integer");
  return static_cast<int>(x);
}

std::string default_run_id() {
  for (const char* v : {"MESHRT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    std::string s = env_or(v);
    if (!s.empty()) return s;
  }
  return "default";
}

bool read_file(const fs::path& p, std::string* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::ostringstream os;
  os << f.rdbuf();
  *out = os.str();
  return true;
}

void write_atomically(const fs::path& dir, const fs::path& final_path, const std::string& data) {
  // Built by appending: GCC 12 at -O3 warns falsely on `"." + string` (-Wrestrict, bug 105329).
  std::string name = ".";
  name += final_path.filename().string();
  name += ".tmp.";
  name += std::to_string(getpid());
  fs::path tmp = dir / name;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MESHRT_CHECK(f.good(), "rendezvous: cannot write " << tmp.string() << " (is " << dir.string()
                                                       << " writable by every rank?)");
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    f.flush();
    MESHRT_CHECK(f.good(), "rendezvous: writing " << tmp.string() << " failed");
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  MESHRT_CHECK(!ec, "rendezvous: renaming " << tmp.string() << " to " << final_path.string()
                                            << " failed: " << ec.message());
}

// Polls until every rank's file exists (or the deadline passes), reading them as they appear.
// Returns the ranks still missing.
std::vector<int> poll_files(int world, const std::function<fs::path(int)>& path_of,
                            std::vector<std::string>* contents, const detail::Deadline& dl) {
  std::vector<bool> have(static_cast<size_t>(world), false);
  auto sleep = std::chrono::microseconds(500);
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      if (have[static_cast<size_t>(r)]) continue;
      std::string s;
      if (read_file(path_of(r), &s)) {
        have[static_cast<size_t>(r)] = true;
        if (contents) (*contents)[static_cast<size_t>(r)] = std::move(s);
      } else {
        missing.push_back(r);
      }
    }
    if (missing.empty() || dl.passed()) return missing;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(100000));
  }
}

}  // namespace

std::string rendezvous_dir_from_env() {
  std::string v = env_or("MESHRT_RENDEZVOUS");
  if (v.empty()) return "";
  const std::string scheme = "file://";
  MESHRT_CHECK(v.rfind(scheme, 0) == 0 && v.size() > scheme.size(),
               "MESHRT_RENDEZVOUS='" << v
                                     << "' is not supported: use file:///path/to/shared/dir "
                                        "(a directory every rank can read and write)");
  return v.substr(scheme.size());
}

std::vector<std::string> file_rendezvous_allgather(const std::string& dir, const std::string& key,
                                                   int rank, int world, const std::string& mine,
                                                   double timeout_s, const std::string& run_in) {
  MESHRT_CHECK(world >= 1 && rank >= 0 && rank < world,
               "rendezvous: rank " << rank << " outside [0, " << world << ")");
  std::error_code ec;
  MESHRT_CHECK(fs::is_directory(dir, ec), "rendezvous directory '"
                                              << dir
                                              << "' does not exist (MESHRT_RENDEZVOUS): create "
                                                 "it on a file system every rank can see");
  const std::string run = run_in.empty() ? default_run_id() : run_in;
  const fs::path d(dir);
  const std::string stem = "meshrt." + run + "." + key + ".";
  auto data_path = [&](int r) { return d / (stem + std::to_string(r)); };
  auto ack_path = [&](int r) { return d / (stem + "ack." + std::to_string(r)); };
  MESHRT_CHECK(!fs::exists(data_path(rank), ec) && !fs::exists(ack_path(rank), ec),
               "rendezvous: " << data_path(rank).string()
                              << " (or its .ack) already exists, left by an earlier job: use a "
                                 "fresh directory or a unique MESHRT_RUN_ID");
  const std::string header = "meshrt-rendezvous world=" + std::to_string(world) + "\n";
  write_atomically(d, data_path(rank), header + mine);

  detail::Deadline dl = detail::Deadline::after(timeout_s);
  std::vector<std::string> got(static_cast<size_t>(world));
  std::vector<int> missing = poll_files(world, data_path, &got, dl);
  if (!missing.empty()) {
    throw CommError("rendezvous '" + key + "' in " + dir + ": " + detail::format_ranks(missing) +
                    " never wrote " + stem + "<rank> within " + std::to_string(timeout_s) +
                    " s (is every rank started with the same WORLD_SIZE and MESHRT_RENDEZVOUS?)");
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::string& s = got[static_cast<size_t>(r)];
    MESHRT_CHECK(s.compare(0, header.size(), header) == 0,
                 "rendezvous: " << data_path(r).string() << " was written for another world size "
                                << "(expected '" << header.substr(0, header.size() - 1)
                                << "'): stale file or mismatched WORLD_SIZE");
    out[static_cast<size_t>(r)] = s.substr(header.size());
  }
  // Acknowledge, then remove our data file once everyone has read it. If some rank is slow to
  // acknowledge the file is simply left behind (harmless: it is namespaced by run id and key).
  write_atomically(d, ack_path(rank), "");
  detail::Deadline ack_dl = detail::Deadline::after(std::min(timeout_s, 5.0));
  if (poll_files(world, ack_path, nullptr, ack_dl).empty()) fs::remove(data_path(rank), ec);
  return out;
}

namespace {

// ---- threads -------------------------------------------------------------------------------

class ThreadLaunch final : public Launch {
 public:
  ThreadLaunch(std::vector<Device> devices, CommBackend backend, CommConfig cfg)
      : backend_(backend), cfg_(cfg) {
    const int n = static_cast<int>(devices.size());
    for (int i = 0; i < n; ++i) {
      RankPlacement p;
      p.rank = i;
      p.world_size = n;
      p.local_rank = i;
      p.local_size = n;
      p.device = devices[static_cast<size_t>(i)];
      local_.push_back(p);
    }
    taken_.assign(static_cast<size_t>(n), false);
    if (backend_ == CommBackend::Host) {
      host_ = make_host_communicators(n, "world", cfg_);
    }
#if defined(MESHRT_WITH_CUDA)
    if (backend_ == CommBackend::Nccl) nccl_id_ = nccl_unique_id();
#endif
  }

  LaunchKind kind() const override { return LaunchKind::Threads; }
  CommBackend backend() const override { return backend_; }
  int world_size() const override { return static_cast<int>(local_.size()); }
  const std::vector<RankPlacement>& local() const override { return local_; }

  std::unique_ptr<Communicator> world(int i) override {
    MESHRT_CHECK(i >= 0 && i < world_size(),
                 "Launch::world(" << i << "): this process runs ranks 0.." << world_size() - 1);
    {
      std::lock_guard<std::mutex> lk(mu_);
      MESHRT_CHECK(!taken_[static_cast<size_t>(i)], "Launch::world(" << i << ") was already taken");
      taken_[static_cast<size_t>(i)] = true;
    }
    if (backend_ == CommBackend::Host) return std::move(host_[static_cast<size_t>(i)]);
#if defined(MESHRT_WITH_CUDA)
    if (backend_ == CommBackend::Nccl) {
      return make_nccl_communicator(nccl_id_, i, world_size(),
                                    local_[static_cast<size_t>(i)].device.index, "world", cfg_);
    }
#endif
    MESHRT_FAIL("ranks as threads support the host and nccl backends, not "
                << comm_backend_name(backend_));
  }

 private:
  CommBackend backend_;
  CommConfig cfg_;
  std::vector<RankPlacement> local_;
  std::mutex mu_;
  std::vector<bool> taken_;
  std::vector<std::unique_ptr<Communicator>> host_;
#if defined(MESHRT_WITH_CUDA)
  NcclUniqueId nccl_id_;
#endif
};

// ---- one rank per process ------------------------------------------------------------------

class ProcessLaunch final : public Launch {
 public:
  ProcessLaunch(LaunchKind kind, CommBackend backend, RankPlacement p, CommConfig cfg,
                std::string rendezvous_dir)
      : kind_(kind), backend_(backend), cfg_(cfg), dir_(std::move(rendezvous_dir)) {
    local_.push_back(p);
  }

  LaunchKind kind() const override { return kind_; }
  CommBackend backend() const override { return backend_; }
  int world_size() const override { return local_[0].world_size; }
  const std::vector<RankPlacement>& local() const override { return local_; }

  std::unique_ptr<Communicator> world(int i) override {
    MESHRT_CHECK(i == 0, "Launch::world(" << i << "): this process runs one rank (index 0)");
    MESHRT_CHECK(!taken_, "Launch::world(0) was already taken");
    taken_ = true;
    const RankPlacement& p = local_[0];
    switch (backend_) {
      case CommBackend::Mpi:
        return make_mpi_world_communicator(cfg_);
      case CommBackend::Host: {
        MESHRT_CHECK(p.world_size == 1, "the host backend runs ranks as threads of one process");
        auto v = make_host_communicators(1, "world", cfg_);
        return std::move(v[0]);
      }
      case CommBackend::Nccl: {
#if defined(MESHRT_WITH_CUDA)
        NcclUniqueId id;
        if (p.rank == 0) id = nccl_unique_id();
        std::string mine(id.bytes.begin(), id.bytes.end());
        std::vector<std::string> all =
            kind_ == LaunchKind::MpiProcesses
                ? mpi_world_allgather(mine, cfg_)
                : file_rendezvous_allgather(dir_, "nccl-id", p.rank, p.world_size, mine,
                                            cfg_.timeout_s);
        std::copy(all[0].begin(), all[0].end(), id.bytes.begin());
        return make_nccl_communicator(id, p.rank, p.world_size, p.device.index, "world", cfg_);
#else
        MESHRT_FAIL("this meshrt was built without CUDA: the nccl backend is unavailable");
#endif
      }
    }
    MESHRT_FAIL("unknown backend");
  }

 private:
  LaunchKind kind_;
  CommBackend backend_;
  CommConfig cfg_;
  std::string dir_;
  std::vector<RankPlacement> local_;
  bool taken_ = false;
};

// Local rank and size from everyone's host name hash (ranks sharing a host are one node).
void local_from_hashes(const std::vector<std::string>& hashes, RankPlacement* p) {
  int before = 0, same = 0;
  for (int r = 0; r < static_cast<int>(hashes.size()); ++r) {
    if (hashes[static_cast<size_t>(r)] != hashes[static_cast<size_t>(p->rank)]) continue;
    ++same;
    if (r < p->rank) ++before;
  }
  p->local_rank = before;
  p->local_size = same;
}

std::string hash_bytes() {
  uint64_t h = detail::hostname_hash();
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

// A process rank's device: from a list, the entry of its local rank; "cuda" means
// cuda:<local rank>; "cpu" (or "cpu:N") means the CPU.
Device process_device(const std::string& spec, int local_rank) {
  if (spec == "cuda") return Device::cuda(local_rank);
  std::vector<Device> ds = parse_devices(spec);
  if (ds.front().is_cpu()) return Device::cpu(0);
  return ds[static_cast<size_t>(local_rank) % ds.size()];
}

CommBackend choose_backend(const std::string& requested, bool cuda, bool processes) {
  if (requested == "auto" || requested.empty()) {
    if (cuda) return CommBackend::Nccl;
    return processes ? CommBackend::Mpi : CommBackend::Host;
  }
  CommBackend b = parse_comm_backend(requested);
  if (b == CommBackend::Nccl) {
    MESHRT_CHECK(cuda, "--backend nccl needs CUDA devices (e.g. --devices cuda:0-7)");
  } else {
    MESHRT_CHECK(
        !cuda, "--backend " << requested << " moves CPU tensors; CUDA devices use --backend nccl");
  }
  return b;
}

}  // namespace

std::unique_ptr<Launch> bootstrap(const LaunchOptions& opts) {
  const std::string spec = opts.devices.empty() ? "cpu" : opts.devices;
  const bool cuda = spec.rfind("cuda", 0) == 0;
  if (cuda) {
    std::string why;
    MESHRT_CHECK(cuda_available(&why), "--devices " << spec << ": CUDA is unavailable (" << why
                                                    << "); use --devices cpu:N instead");
  }
  if (mpi_launched()) {
    mpi_init();
    RankPlacement p;
    p.rank = mpi_world_rank();
    p.world_size = mpi_world_size();
    local_from_hashes(mpi_world_allgather(hash_bytes(), opts.config), &p);
    p.device = process_device(spec, p.local_rank);
    CommBackend b = choose_backend(opts.backend, cuda, true);
    MESHRT_CHECK(b != CommBackend::Host || p.world_size == 1,
                 "--backend host runs ranks as threads of one process, but this process is rank "
                     << p.rank << " of " << p.world_size
                     << " launched by mpirun/srun: use --backend mpi (or auto)");
    set_log_rank(p.rank, p.world_size);
    return std::make_unique<ProcessLaunch>(LaunchKind::MpiProcesses, b, p, opts.config, "");
  }
  if (!env_or("RANK").empty() && !env_or("WORLD_SIZE").empty()) {
    RankPlacement p;
    p.rank = env_int("RANK", 0);
    p.world_size = env_int("WORLD_SIZE", 1);
    MESHRT_CHECK(p.world_size >= 1 && p.rank < p.world_size,
                 "RANK=" << p.rank << " is outside WORLD_SIZE=" << p.world_size);
    std::string dir = rendezvous_dir_from_env();
    MESHRT_CHECK(p.world_size == 1 || !dir.empty(),
                 "RANK/WORLD_SIZE are set (torchrun-style launch of "
                     << p.world_size
                     << " processes) but MESHRT_RENDEZVOUS is not: set "
                        "MESHRT_RENDEZVOUS=file:///shared/dir, or launch with mpirun / srun");
    if (!env_or("LOCAL_RANK").empty()) {
      p.local_rank = env_int("LOCAL_RANK", 0);
      p.local_size = env_int("LOCAL_WORLD_SIZE", std::max(1, p.local_rank + 1));
    } else if (p.world_size > 1) {
      local_from_hashes(file_rendezvous_allgather(dir, "hosts", p.rank, p.world_size, hash_bytes(),
                                                  opts.config.timeout_s),
                        &p);
    }
    p.device = process_device(spec, p.local_rank);
    CommBackend b = choose_backend(opts.backend, cuda, true);
    MESHRT_CHECK(p.world_size == 1 || b == CommBackend::Nccl,
                 "CPU ranks as torchrun-style processes have no transport: launch them with "
                 "mpirun / srun (MPI backend), or run them as threads with --devices cpu:"
                     << p.world_size);
    if (p.world_size == 1 && b == CommBackend::Mpi) b = CommBackend::Host;
    set_log_rank(p.rank, p.world_size);
    return std::make_unique<ProcessLaunch>(LaunchKind::EnvProcesses, b, p, opts.config, dir);
  }
  std::vector<Device> devices = parse_devices(spec);
  CommBackend b = choose_backend(opts.backend, cuda, false);
  MESHRT_CHECK(b != CommBackend::Mpi,
               "--backend mpi needs one process per rank: launch with mpirun -np N (this process "
               "was not started by an MPI launcher)");
  return std::make_unique<ThreadLaunch>(std::move(devices), b, opts.config);
}

void Launch::run(const std::function<void(const RankPlacement&, Communicator&)>& fn) {
  const int n = static_cast<int>(local().size());
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(n));
  std::mutex mu;
  std::exception_ptr first;
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
      if (was_first) MESHRT_LOG_ERROR("rank " << p.rank << " failed: " << msg);
      if (comms[static_cast<size_t>(i)]) {
        comms[static_cast<size_t>(i)]->abort("rank " + std::to_string(p.rank) + " failed: " + msg);
      }
    }
  };
  if (n == 1) {
    body(0);
  } else {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
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
  os << ", " << comm_backend_name(backend()) << " backend";
  return os.str();
}

}  // namespace meshrt
