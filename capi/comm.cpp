// Worlds and communicators of the C API: config validation, the process-local rendezvous behind
// meshrt_get_unique_id / meshrt_comm_init_rank, init_all, MPI and file worlds, NCCL adoption,
// destroy / abort / queries / split.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_internal.h"
#include "collectives/backend_registry.h"
#include "collectives/bootstrap.h"
#include "collectives/comm_detail.h"
#include "collectives/mpi_backend.h"
#include "collectives/nccl_comm.h"
#include "runtime/backend.h"
#include "runtime/cuda_plugin.h"
#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/thread.h"

namespace meshrt::capi {

namespace {

// A config after validation and defaults.
struct Resolved {
  CommConfig cfg;
  double init_timeout_s = 300;  // 0: no limit
  DeviceType type = DeviceType::CPU;
  int device_index = -1;
  std::string backend = "auto";
};

constexpr double kMaxTimeoutS = 1e9;  // about 31 years: "never" is 0

// A timeout field: a number (< 0: the default; 0: no limit) of at most kMaxTimeoutS seconds.
void check_timeout(const char* field, double v) {
  CAPI_CHECK(!std::isnan(v) && v <= kMaxTimeoutS, MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_comm_config." << field << " is " << v
                                   << ": pass seconds up to 1e9, 0 for no limit or -1 for the "
                                      "default");
}

// The fields of a caller's config (NULL: all defaults), checked; its header fields first.
meshrt_comm_config_t read_comm_config(const meshrt_comm_config_t* c) {
  meshrt_comm_config_t v = MESHRT_COMM_CONFIG_INITIALIZER;
  if (!c) return v;
  CAPI_CHECK(c->magic == MESHRT_COMM_CONFIG_MAGIC, MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_comm_config.magic is 0x"
                 << std::hex << c->magic << " instead of 0x" << MESHRT_COMM_CONFIG_MAGIC << std::dec
                 << ": initialise the config with MESHRT_COMM_CONFIG_INITIALIZER (or pass NULL)");
  CAPI_CHECK(c->size >= sizeof(meshrt_comm_config_t), MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_comm_config.size is "
                 << c->size << " but API version " << MESHRT_API_VERSION << "'s config has "
                 << sizeof(meshrt_comm_config_t)
                 << " bytes: initialise it with MESHRT_COMM_CONFIG_INITIALIZER");
  CAPI_CHECK(c->version == MESHRT_API_VERSION, MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_comm_config.version is "
                 << c->version << " but this library implements C API version "
                 << MESHRT_API_VERSION << ": rebuild against this library's meshrt.h");
  // Fields a later header appends past v1's size would be read here, only when c->size says
  // they are there.
  std::memcpy(&v, c, sizeof(v));
  check_timeout("timeout_s", v.timeout_s);
  check_timeout("init_timeout_s", v.init_timeout_s);
  CAPI_CHECK(v.debug <= 1, MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_comm_config.debug is "
                 << v.debug
                 << ": pass 1 (ranks compare each call first), 0 (no) or -1 (MESHRT_COMM_DEBUG)");
  CAPI_CHECK(v.device_type == MESHRT_DEVICE_CPU || v.device_type == MESHRT_DEVICE_CUDA,
             MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_comm_config.device_type is "
                 << v.device_type << ": use MESHRT_DEVICE_CPU (0) or MESHRT_DEVICE_CUDA (1)");
  return v;
}

// A CUDA device index a caller passed (`what`): below this process's device count.
void check_cuda_index(const std::string& what, int index) {
  const int count = cuda_device_count();
  CAPI_CHECK(index < count, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " is " << index << " but this process sees " << count
                  << " CUDA device(s): pass 0 .. " << count - 1);
}

Resolved resolve_config(const meshrt_comm_config_t* c) {
  check_environment_variables();  // may have changed since meshrt_init
  Resolved r;
  r.cfg = CommConfig::from_env();
  const meshrt_comm_config_t v = read_comm_config(c);
  if (v.timeout_s >= 0) {
    r.cfg.timeout_s = v.timeout_s;
    r.cfg.timeout_setting = "meshrt_comm_config.timeout_s";  // what timeout messages name
  }
  if (v.debug >= 0) r.cfg.debug = v.debug != 0;
  if (v.init_timeout_s >= 0) {
    r.init_timeout_s = v.init_timeout_s;
  } else {
    r.init_timeout_s = r.cfg.timeout_s > 0 ? r.cfg.timeout_s : 300;
  }
  r.type = v.device_type == MESHRT_DEVICE_CUDA ? DeviceType::CUDA : DeviceType::CPU;
  if (r.type == DeviceType::CUDA) {
    // Loads libmeshrt-cuda.so when it is a plugin: its load error is the one line said here.
    std::string why;
    CAPI_CHECK(detail::cuda_plugin(&why) != nullptr, MESHRT_ERROR_UNSUPPORTED,
               "meshrt_comm_config.device_type is MESHRT_DEVICE_CUDA but "
                   << why << ": use MESHRT_DEVICE_CPU or install meshrt's CUDA backend");
    check_cuda_index("meshrt_comm_config.device_index", v.device_index);
  }
  r.device_index = v.device_index;
  if (v.backend && v.backend[0]) r.backend = v.backend;
  return r;
}

const char* device_type_name(DeviceType t) { return t == DeviceType::CUDA ? "cuda" : "cpu"; }

// The registry's backend for `plan`, prepared: the refusals are what this build cannot do.
WorldFactory prepare_world(const WorldPlan& plan, const std::string& backend) {
  const CommBackend* b = nullptr;
  try {
    b = &choose_collective_backend(backend, plan);
  } catch (const CommError&) {
    throw;
  } catch (const Error& e) {
    fail(MESHRT_ERROR_UNSUPPORTED, e.message());
  }
  return b->prepare(plan);
}

// Runs f and returns its failure as (status, message) instead of throwing.
template <class F>
std::pair<meshrt_status_t, std::string> capture(F&& f) {
  try {
    f();
    return {MESHRT_SUCCESS, ""};
  } catch (const StatusError& e) {
    return {e.status(), e.what()};
  } catch (const CommError& e) {
    return {MESHRT_ERROR_COMM, e.message()};
  } catch (const OutOfMemoryError& e) {
    return {MESHRT_ERROR_OUT_OF_MEMORY, e.message()};
  } catch (const Error& e) {
    return {MESHRT_ERROR_INVALID_ARGUMENT, e.message()};  // as status_from_current_exception
  } catch (const std::bad_alloc&) {
    return {MESHRT_ERROR_OUT_OF_MEMORY, "out of memory (std::bad_alloc)"};
  } catch (const std::exception& e) {
    return {MESHRT_ERROR_INTERNAL, std::string("internal error (please report): ") + e.what()};
  }
}

// ---- the process-local rendezvous of meshrt_comm_init_rank ----

constexpr char kIdPrefix[] = "meshrt-id-v1:";

struct Rendezvous {
  int nranks = 0;
  Resolved conf;               // the first rank's
  std::vector<int> device_of;  // per rank; -2 until it joined
  int arrived = 0;
  bool ready = false;
  meshrt_status_t status = MESHRT_SUCCESS;  // a failure every rank reports
  std::string error;
  WorldFactory factory;
  std::condition_variable cv;
};

std::mutex g_rv_mu;
std::unordered_map<std::string, std::shared_ptr<Rendezvous>> g_rv;

std::string id_key(const meshrt_unique_id_t& id) {
  const size_t n = strnlen(id.internal, sizeof(id.internal));
  std::string key(id.internal, n);
  CAPI_CHECK(n < sizeof(id.internal) && key.rfind(kIdPrefix, 0) == 0, MESHRT_ERROR_INVALID_ARGUMENT,
             "the unique id was not made by meshrt_get_unique_id (it does not start with '"
                 << kIdPrefix << "'): have one rank call meshrt_get_unique_id and pass its id to "
                 << "every rank");
  const long pid = std::strtol(key.c_str() + sizeof(kIdPrefix) - 1, nullptr, 10);
  CAPI_CHECK(pid == static_cast<long>(getpid()), MESHRT_ERROR_UNSUPPORTED,
             "the unique id was made by process "
                 << pid << ", not this one (" << getpid()
                 << "): meshrt_comm_init_rank joins threads of the process that made the id; "
                    "for one rank per process use meshrt_comm_init_mpi or meshrt_comm_init_file");
  return key;
}

std::string missing_ranks(const Rendezvous& rv) {
  std::ostringstream os;
  int n = 0;
  for (int r = 0; r < rv.nranks; ++r) {
    if (rv.device_of[static_cast<size_t>(r)] != -2) continue;
    os << (n++ ? ", " : "") << r;
  }
  return (n == 1 ? "rank " : "ranks ") + os.str();
}

WorldPlan thread_plan(const Resolved& conf, const std::vector<int>& devices) {
  WorldPlan plan;
  plan.kind = LaunchKind::Threads;
  plan.device_type = conf.type;
  plan.world_size = static_cast<int>(devices.size());
  plan.config = conf.cfg;
  plan.names = LaunchNames::c_api();
  for (int r = 0; r < plan.world_size; ++r) {
    RankPlacement p;
    p.rank = r;
    p.world_size = plan.world_size;
    p.local_rank = r;
    p.local_size = plan.world_size;
    p.device = conf.type == DeviceType::CPU ? Device::cpu(r)
                                            : Device::cuda(devices[static_cast<size_t>(r)]);
    plan.local.push_back(p);
  }
  return plan;
}

int rank_device(const Resolved& conf, int rank) {
  return conf.device_index >= 0 ? conf.device_index : rank;
}

std::unique_ptr<Communicator> join_world(const std::string& key, int nranks, int rank,
                                         const Resolved& conf) {
  std::unique_lock<std::mutex> lk(g_rv_mu);
  std::shared_ptr<Rendezvous>& slot = g_rv[key];
  if (!slot) {
    slot = std::make_shared<Rendezvous>();
    slot->nranks = nranks;
    slot->conf = conf;
    slot->device_of.assign(static_cast<size_t>(nranks), -2);
  }
  std::shared_ptr<Rendezvous> rv = slot;
  if (rv->status != MESHRT_SUCCESS) fail(rv->status, rv->error);
  CAPI_CHECK(nranks == rv->nranks, MESHRT_ERROR_INVALID_ARGUMENT,
             "rank " << rank << " passed nranks " << nranks << " but the first rank to join this "
                     << "id passed " << rv->nranks << ": pass the same nranks on every rank");
  CAPI_CHECK(conf.type == rv->conf.type, MESHRT_ERROR_INVALID_ARGUMENT,
             "rank " << rank << " asked for " << device_type_name(conf.type)
                     << " devices but the first rank to join this id asked for "
                     << device_type_name(rv->conf.type)
                     << ": pass the same meshrt_comm_config.device_type on every rank");
  CAPI_CHECK(rv->device_of[static_cast<size_t>(rank)] == -2, MESHRT_ERROR_INVALID_USAGE,
             "rank " << rank << " already joined this world: each of ranks 0.." << nranks - 1
                     << " calls meshrt_comm_init_rank once");
  rv->device_of[static_cast<size_t>(rank)] = rank_device(conf, rank);
  ++rv->arrived;
  if (rv->arrived == nranks) {
    auto [st, msg] = capture([&] {
      rv->factory = prepare_world(thread_plan(rv->conf, rv->device_of), rv->conf.backend);
    });
    rv->status = st;
    rv->error = msg;
    rv->ready = true;
    g_rv.erase(key);  // complete: the id may start a new world
    rv->cv.notify_all();
  } else {
    auto done = [&] { return rv->ready || rv->status != MESHRT_SUCCESS; };
    if (conf.init_timeout_s > 0) {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(conf.init_timeout_s));
      if (!rv->cv.wait_until(lk, deadline, done)) {
        std::ostringstream os;
        os << "world of " << nranks << " ranks: " << missing_ranks(*rv) << " never arrived within "
           << conf.init_timeout_s
           << " s (meshrt_comm_config.init_timeout_s): every rank must call meshrt_comm_init_rank "
              "with the "
              "same id; this world is abandoned, start a new one with a new id";
        rv->status = MESHRT_ERROR_TIMEOUT;
        rv->error = os.str();
        rv->cv.notify_all();  // the failed entry stays, so late ranks fail at once
      }
    } else {
      rv->cv.wait(lk, done);
    }
  }
  if (rv->status != MESHRT_SUCCESS) fail(rv->status, rv->error);
  WorldFactory factory = rv->factory;
  lk.unlock();
  return factory(rank);
}

// ---- process worlds (MPI, files) ----

meshrt_comm_t init_process_world(std::shared_ptr<BootstrapTransport> tr, LaunchKind kind,
                                 const Resolved& conf) {
  RankPlacement p;
  p.rank = tr->rank();
  p.world_size = tr->size();
  const std::string host = detail::node_identity();
  const std::vector<std::string> hosts = tr->all_gather("capi.hosts", host);
  p.local_size = 0;
  for (int r = 0; r < p.world_size; ++r) {
    if (hosts[static_cast<size_t>(r)] != host) continue;
    if (r < p.rank) ++p.local_rank;
    ++p.local_size;
  }
  const std::string mine = std::string(device_type_name(conf.type)) + " backend " + conf.backend;
  const std::vector<std::string> all = tr->all_gather("capi.config", mine);
  for (int r = 0; r < p.world_size; ++r) {
    CAPI_CHECK(
        all[static_cast<size_t>(r)] == mine, MESHRT_ERROR_INVALID_ARGUMENT,
        "rank " << p.rank << " asked for " << mine << " but rank " << r << " for "
                << all[static_cast<size_t>(r)]
                << ": pass the same meshrt_comm_config.device_type and backend on every rank");
  }
  p.device = conf.type == DeviceType::CPU
                 ? Device::cpu(0)
                 : Device::cuda(conf.device_index >= 0 ? conf.device_index : p.local_rank);
  WorldPlan plan;
  plan.kind = kind;
  plan.device_type = conf.type;
  plan.world_size = p.world_size;
  plan.local.push_back(p);
  plan.config = conf.cfg;
  plan.names = LaunchNames::c_api();
  plan.transport = tr.get();
  WorldFactory factory = prepare_world(plan, conf.backend);
  return register_comm(factory(0), p.local_size, std::move(tr));
}

// The world of meshrt_comm_init_file / _tcp once their own arguments are checked: the rank's, then
// the transport `make(wait_s)` gives; wait_s is how long it waits for the other ranks (a config
// timeout of 0 would give up at once, so it then waits as long as it takes).
meshrt_comm_t init_rendezvous_world(
    int nranks, int rank, const meshrt_comm_config_t* config,
    const std::function<std::shared_ptr<BootstrapTransport>(double wait_s)>& make) {
  // Bounded before the transport sizes its tables by nranks (INT_MAX ran out of memory).
  CAPI_CHECK(nranks >= 1 && nranks <= kMaxProcessRanks, MESHRT_ERROR_INVALID_ARGUMENT,
             "nranks is " << nranks << ": pass 1.." << kMaxProcessRanks
                          << " (the processes of the world)");
  CAPI_CHECK(rank >= 0 && rank < nranks, MESHRT_ERROR_INVALID_ARGUMENT,
             "rank " << rank << " is outside [0, " << nranks << "): pass 0 .. nranks-1");
  const Resolved conf = resolve_config(config);
  const double wait_s = conf.init_timeout_s > 0 ? conf.init_timeout_s : 1e9;
  return init_process_world(make(wait_s), LaunchKind::EnvProcesses, conf);
}

}  // namespace

meshrt_comm_t register_comm(std::unique_ptr<Communicator> comm, int local_ranks,
                            std::shared_ptr<BootstrapTransport> transport) {
  auto obj = std::make_shared<CommObj>();
  ContextOptions o;
  o.rank = comm->rank();
  o.world_size = comm->size();
  o.local_ranks = std::max(1, local_ranks);
  // The context's stream workers log as the rank of the thread that creates them: this one.
  const int prev_rank = log_rank(), prev_world = log_world();
  set_log_rank(comm->rank(), comm->size());
  obj->ctx = std::make_shared<Context>(comm->device(), o);
  set_log_rank(prev_rank, prev_world);
  obj->comm = std::move(comm);
  obj->transport = std::move(transport);
  auto so = std::make_shared<StreamObj>();
  so->stream = &obj->ctx->compute_stream();
  so->keep = obj->ctx;
  so->is_default = true;
  set_owner(*so, *obj);
  obj->default_stream_handle = Registry::get().add(Kind::Stream, so);
  return static_cast<meshrt_comm_t>(Registry::get().add(Kind::Comm, obj));
}

namespace {
// The MPI backend (libmeshrt-mpi.so, loaded once); a plugin that cannot be loaded is
// MESHRT_ERROR_UNSUPPORTED (this installation lacks it), with the loader's one-line reason.
const detail::MpiBackend& mpi_backend_or_fail() {
  try {
    return detail::mpi_backend();
  } catch (const Error& e) {
    fail(MESHRT_ERROR_UNSUPPORTED, e.message());
  }
}

// The world of meshrt_comm_init_mpi (and of meshrt_comm_init_env under an MPI launcher).
meshrt_comm_t init_mpi_world(void* mpi_comm, const meshrt_comm_config_t* config) {
  const Resolved conf = resolve_config(config);
  CAPI_CHECK(mpi_launched() || mpi_comm != nullptr, MESHRT_ERROR_INVALID_USAGE,
             "this process was not started by an MPI launcher (no OMPI_ / PMI_ / PMIX_ / "
             "SLURM_ variables): run it under mpirun / srun, or use meshrt_comm_init_rank "
             "(threads) or meshrt_comm_init_file (processes)");
  const detail::MpiBackend& mpi = mpi_backend_or_fail();
  mpi.init();
  if (mpi_comm != nullptr) {
    std::string why;
    const int bad = mpi.check_world(mpi_comm, &why);
    CAPI_CHECK(bad != 1, MESHRT_ERROR_INVALID_ARGUMENT, why);
    CAPI_CHECK(bad == 0, MESHRT_ERROR_UNSUPPORTED, why);
  }
  std::shared_ptr<BootstrapTransport> tr =
      mpi.make_transport(conf.init_timeout_s, "meshrt_comm_config.init_timeout_s");
  return init_process_world(std::move(tr), LaunchKind::MpiProcesses, conf);
}

// A whole-number variable a launcher sets (RANK, WORLD_SIZE), in [lo, hi]. Unset: no launcher
// started this process as one rank (INVALID_USAGE); a bad value is INVALID_ARGUMENT.
int launch_variable(const char* name, int lo, int hi) {
  const std::string v = env_or(name);
  CAPI_CHECK(!v.empty(), MESHRT_ERROR_INVALID_USAGE,
             "no launcher started this process as one rank: "
                 << name
                 << " is not set (and no MPI / Slurm variables are): run it under mpirun, srun "
                    "or torchrun (which set RANK and WORLD_SIZE), or use meshrt_comm_init_all / "
                    "meshrt_comm_init_rank (ranks as threads) or meshrt_comm_init_file / "
                    "meshrt_comm_init_tcp");
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  CAPI_CHECK(end != v.c_str() && *end == '\0' && errno == 0 && x >= lo && x <= hi,
             MESHRT_ERROR_INVALID_ARGUMENT,
             name << "='" << v << "' is not a whole number in [" << lo << ", " << hi
                  << "]: the launcher sets it; check the launch");
  return static_cast<int>(x);
}
}  // namespace

}  // namespace meshrt::capi

using namespace meshrt;
using namespace meshrt::capi;

extern "C" {

meshrt_status_t meshrt_get_unique_id(meshrt_unique_id_t* id) {
  return guarded(__func__, [&] {
    CAPI_CHECK(id != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "id is NULL: pass the address of a meshrt_unique_id_t");
    static std::atomic<uint64_t> counter{0};
    std::random_device rd;
    const uint64_t salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    std::ostringstream os;
    os << kIdPrefix << getpid() << ":" << counter.fetch_add(1) << ":" << std::hex << salt;
    const std::string s = os.str();
    std::memset(id->internal, 0, sizeof(id->internal));
    std::memcpy(id->internal, s.data(), std::min(s.size(), sizeof(id->internal) - 1));
  });
}

meshrt_status_t meshrt_comm_init_rank(meshrt_comm_t* comm, int nranks, meshrt_unique_id_t id,
                                      int rank, const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    require_init();
    CAPI_CHECK(nranks >= 1 && nranks <= kMaxRanksPerProcess, MESHRT_ERROR_INVALID_ARGUMENT,
               "nranks is " << nranks << ": pass 1.." << kMaxRanksPerProcess
                            << " (the ranks of one process, each a thread)");
    CAPI_CHECK(rank >= 0 && rank < nranks, MESHRT_ERROR_INVALID_ARGUMENT,
               "rank " << rank << " is outside [0, " << nranks << "): pass 0 .. nranks-1");
    const Resolved conf = resolve_config(config);
    if (conf.type == DeviceType::CUDA)
      check_cuda_index("rank " + std::to_string(rank) + "'s GPU (meshrt_comm_config.device_index " +
                           std::to_string(conf.device_index) + ")",
                       rank_device(conf, rank));
    const std::string key = id_key(id);
    std::unique_ptr<Communicator> c = join_world(key, nranks, rank, conf);
    *comm = register_comm(std::move(c), nranks);
  });
}

meshrt_status_t meshrt_comm_init_all(meshrt_comm_t* comms, int n, const int* devices,
                                     const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comms, "comms");
    // n is checked before comms[0..n) is written: a garbage n must not write past the array.
    CAPI_CHECK(n >= 1 && n <= kMaxRanksPerProcess, MESHRT_ERROR_INVALID_ARGUMENT,
               "n is " << n << ": pass 1.." << kMaxRanksPerProcess
                       << " (the ranks of one process, each a thread)");
    for (int i = 0; i < n; ++i) comms[i] = nullptr;
    require_init();
    const Resolved conf = resolve_config(config);
    std::vector<int> devs(static_cast<size_t>(n));
    CAPI_CHECK(devices == nullptr || conf.type == DeviceType::CUDA, MESHRT_ERROR_INVALID_ARGUMENT,
               "devices is set but meshrt_comm_config.device_type is MESHRT_DEVICE_CPU: pass "
               "NULL for CPU ranks, or MESHRT_DEVICE_CUDA for GPUs");
    for (int i = 0; i < n; ++i) {
      devs[static_cast<size_t>(i)] = devices ? devices[i] : i;
      if (conf.type != DeviceType::CUDA) continue;
      CAPI_CHECK(devs[static_cast<size_t>(i)] >= 0, MESHRT_ERROR_INVALID_ARGUMENT,
                 "devices[" << i << "] is " << devices[i] << ": pass rank " << i << "'s GPU index");
      check_cuda_index(devices ? "devices[" + std::to_string(i) + "]"
                               : "rank " + std::to_string(i) + "'s GPU (devices NULL)",
                       devs[static_cast<size_t>(i)]);
    }
    WorldFactory factory = prepare_world(thread_plan(conf, devs), conf.backend);
    // One thread per rank: initialisation may be collective (NCCL).
    std::vector<std::unique_ptr<Communicator>> made(static_cast<size_t>(n));
    std::vector<std::exception_ptr> errs(static_cast<size_t>(n));
    std::vector<std::thread> threads = start_threads(
        n,
        [&](int i) {
          try {
            made[static_cast<size_t>(i)] = factory(i);
          } catch (...) {
            errs[static_cast<size_t>(i)] = std::current_exception();
          }
        },
        "the ranks of meshrt_comm_init_all", "lower n or raise ulimit -u / ulimit -v");
    for (auto& t : threads) t.join();
    for (auto& e : errs) {
      if (e) std::rethrow_exception(e);
    }
    std::vector<meshrt_comm_t> out;
    try {
      for (int i = 0; i < n; ++i)
        out.push_back(register_comm(std::move(made[static_cast<size_t>(i)]), n));
    } catch (...) {
      for (meshrt_comm_t h : out) meshrt_comm_destroy(h);
      throw;
    }
    for (int i = 0; i < n; ++i) comms[i] = out[static_cast<size_t>(i)];
  });
}

meshrt_status_t meshrt_comm_init_mpi(meshrt_comm_t* comm, void* mpi_comm,
                                     const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    require_init();
    *comm = init_mpi_world(mpi_comm, config);
  });
}

meshrt_status_t meshrt_comm_init_env(meshrt_comm_t* comm, const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    require_init();
    check_environment_variables();  // MESHRT_RENDEZVOUS is read below
    if (mpi_launched()) {
      *comm = init_mpi_world(nullptr, config);
      return;
    }
    const int nranks = launch_variable("WORLD_SIZE", 1, kMaxProcessRanks);
    const int rank = launch_variable("RANK", 0, nranks - 1);
    LaunchNames names;  // the launcher's variables, the C API's words for the rest
    names.backend = LaunchNames::c_api().backend;
    names.cpu_threads = LaunchNames::c_api().cpu_threads;
    names.cuda_devices = LaunchNames::c_api().cuda_devices;
    const std::string dir = rendezvous_dir_from_env();
    if (!dir.empty()) {
      *comm = init_rendezvous_world(nranks, rank, config, [&](double wait_s) {
        return make_file_transport(dir, rank, nranks, wait_s, "", names);
      });
      return;
    }
    std::string host;
    int port = 0;
    bool tcp = false;
    try {
      tcp = rendezvous_tcp_from_env(&host, &port);
    } catch (const Error& e) {
      fail(MESHRT_ERROR_INVALID_ARGUMENT, e.message());  // a MASTER_PORT that is not a port
    }
    CAPI_CHECK(tcp, MESHRT_ERROR_INVALID_USAGE,
               "RANK=" << rank << " and WORLD_SIZE=" << nranks
                       << " are set but no rendezvous address is: set MASTER_ADDR and "
                          "MASTER_PORT (torchrun does), or MESHRT_RENDEZVOUS=file:///shared/dir "
                          "or tcp://host:port");
    *comm = init_rendezvous_world(nranks, rank, config, [&](double wait_s) {
      return make_tcp_transport(host, port, rank, nranks, wait_s, names);
    });
  });
}

meshrt_status_t meshrt_comm_init_file(meshrt_comm_t* comm, const char* dir, int nranks, int rank,
                                      const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    require_init();
    CAPI_CHECK(dir != nullptr && dir[0] != '\0', MESHRT_ERROR_INVALID_ARGUMENT,
               "dir is NULL or empty: pass a directory every rank can read and write");
    std::error_code ec;
    CAPI_CHECK(std::filesystem::is_directory(dir, ec), MESHRT_ERROR_INVALID_ARGUMENT,
               "dir '" << dir << "' is not a directory: create it (on storage every rank sees)");
    *comm = init_rendezvous_world(nranks, rank, config, [&](double wait_s) {
      return make_file_transport(dir, rank, nranks, wait_s, "", LaunchNames::c_api());
    });
  });
}

meshrt_status_t meshrt_comm_init_tcp(meshrt_comm_t* comm, const char* host, int port, int nranks,
                                     int rank, const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    require_init();
    CAPI_CHECK(host != nullptr && host[0] != '\0', MESHRT_ERROR_INVALID_ARGUMENT,
               "host is NULL or empty: pass rank 0's address, e.g. \"127.0.0.1\"");
    CAPI_CHECK(port >= 1 && port <= 65535, MESHRT_ERROR_INVALID_ARGUMENT,
               "port is " << port << ": pass a TCP port in 1..65535 that rank 0 can listen on");
    *comm = init_rendezvous_world(nranks, rank, config, [&](double wait_s) {
      return make_tcp_transport(host, port, rank, nranks, wait_s, LaunchNames::c_api());
    });
  });
}

meshrt_status_t meshrt_comm_adopt_nccl(meshrt_comm_t* comm, void* nccl_comm, int device,
                                       const meshrt_comm_config_t* config) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    require_init();
    CAPI_CHECK(nccl_comm != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "nccl_comm is NULL: pass the engine's ncclComm_t");
    CAPI_CHECK(device >= 0, MESHRT_ERROR_INVALID_ARGUMENT,
               "device is " << device << ": pass the CUDA device the NCCL communicator uses");
    const Resolved conf = resolve_config(config);
    std::string why;
    CAPI_CHECK(detail::cuda_plugin(&why) != nullptr, MESHRT_ERROR_UNSUPPORTED,
               "no NCCL backend: " << why
                                   << ": adopting an NCCL communicator needs meshrt's CUDA "
                                      "backend");
    check_cuda_index("device", device);
    *comm = register_comm(adopt_nccl_communicator(nccl_comm, device, "world", conf.cfg), 1);
  });
}

meshrt_status_t meshrt_comm_destroy(meshrt_comm_t comm) {
  return guarded(__func__, [&] {
    if (comm == nullptr) return;
    std::shared_ptr<CommObj> live;
    try {
      live = find_comm(comm);
    } catch (const StatusError&) {
      // not live: reported below
    }
    CAPI_CHECK(!live || !live->mesh_owned, MESHRT_ERROR_INVALID_USAGE,
               "comm (" << static_cast<void*>(comm)
                        << ") is a mesh's dim communicator (from meshrt_mesh_comm), owned by the "
                           "mesh: meshrt_mesh_destroy frees it, do not destroy it yourself");
    std::shared_ptr<CommObj> c =
        std::static_pointer_cast<CommObj>(Registry::get().remove(comm, Kind::Comm));
    CAPI_CHECK(c != nullptr, MESHRT_ERROR_INVALID_USAGE,
               "comm (" << static_cast<void*>(comm)
                        << ") is not a live communicator handle: it was destroyed already or never "
                           "created by meshrt");
    Registry::get().remove(c->default_stream_handle, Kind::Stream);
    try {
      if (!c->comm->aborted()) c->comm->wait_idle();
    } catch (...) {
      // the failed work reported its errors through its events
    }
  });
}

meshrt_status_t meshrt_comm_abort(meshrt_comm_t comm) {
  return guarded(__func__, [&] {
    find_comm(comm)->comm->abort("aborted by the application (meshrt_comm_abort)");
  });
}

meshrt_status_t meshrt_comm_rank(meshrt_comm_t comm, int* rank) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    check_out(rank, "rank");
    *rank = c->comm->rank();
  });
}

meshrt_status_t meshrt_comm_size(meshrt_comm_t comm, int* size) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    check_out(size, "size");
    *size = c->comm->size();
  });
}

meshrt_status_t meshrt_comm_device(meshrt_comm_t comm, meshrt_device_type_t* type, int* index) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    const Device d = c->comm->device();
    if (type) *type = d.is_cuda() ? MESHRT_DEVICE_CUDA : MESHRT_DEVICE_CPU;
    if (index) *index = d.index;
  });
}

meshrt_status_t meshrt_comm_backend(meshrt_comm_t comm, const char** name) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    check_out(name, "name");
    // Interned: the backends' names are few, and the pointer outlives the communicator.
    static std::mutex mu;
    static std::set<std::string, std::less<>> names;
    std::lock_guard<std::mutex> lk(mu);
    *name = names.emplace(c->comm->backend()).first->c_str();
  });
}

meshrt_status_t meshrt_comm_split(meshrt_comm_t comm, int color, int key, meshrt_comm_t* new_comm) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    check_out(new_comm, "new_comm");
    *new_comm = nullptr;
    std::unique_ptr<Communicator> sub = c->comm->split(color < 0 ? kNoColor : color, key);
    if (sub) *new_comm = register_comm(std::move(sub), c->ctx->local_ranks(), c->transport);
  });
}

}  // extern "C"
