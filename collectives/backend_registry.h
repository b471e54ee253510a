// The collective-backend registry: every compiled-in backend (host, mpi, nccl, ...) with the
// launches it serves, its priority for "auto" and the factory of a launch's world communicators.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/launch_names.h"
#include "meshrt/export.h"
#include "runtime/device.h"

namespace meshrt {

class BootstrapTransport;

enum class LaunchKind : uint8_t {
  Threads,       // ranks are threads of this process, one per entry of --devices
  MpiProcesses,  // mpirun / srun: one rank per process, MPI provides rank and size
  EnvProcesses,  // torchrun-style RANK / WORLD_SIZE / LOCAL_RANK with a file rendezvous
};
MESHRT_API const char* launch_kind_name(LaunchKind k);

struct MESHRT_API RankPlacement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // among the ranks on this node (processes: from a hostname hash)
  int local_size = 1;
  Device device;
};

// The launch a backend is asked to serve.
struct MESHRT_API WorldPlan {
  LaunchKind kind = LaunchKind::Threads;
  DeviceType device_type = DeviceType::CPU;
  int world_size = 1;
  std::vector<RankPlacement> local;  // the ranks this process runs
  CommConfig config;
  // Process launches: the all-gather among the processes, for the backend's exchanges at
  // initialisation (it lives as long as the launch). nullptr for threads and for a lone
  // torchrun-style process.
  BootstrapTransport* transport = nullptr;
  // How refusals name the launch's settings (the C API: its own words).
  LaunchNames names;
  // "2 ranks as threads on cpu", "rank 1 of 4 as mpi-processes on cuda".
  std::string str() const;
};

// The world communicator of local rank i (index into WorldPlan::local); called once per index,
// from that rank's thread (NCCL initialisation is collective: all threads call at once).
using WorldFactory = std::function<std::unique_ptr<Communicator>(int i)>;

struct MESHRT_API CommBackend {
  std::string name;  // what --backend selects: "host", "mpi", "nccl"
  // Among the backends that serve a launch, "auto" picks the one with the highest priority.
  int auto_priority = 0;
  // "" when the backend can run `plan`; otherwise why not and what to change (shown to users).
  std::function<std::string(const WorldPlan& plan)> refuses;
  // Prepares the world communicators of `plan` (which refuses() accepted).
  std::function<WorldFactory(const WorldPlan& plan)> prepare;
};

// The backends compiled into this build, in registration order (collectives/CMakeLists.txt
// lists them; each backend file defines register_<name>_backend, called once, on first use).
MESHRT_API const std::vector<CommBackend>& collective_backends();
// "host, mpi, nccl".
MESHRT_API std::string collective_backend_names();
// The backend called `name`; throws listing the known ones when there is none.
MESHRT_API const CommBackend& find_collective_backend(const std::string& name);
// The backend for `requested` ("auto" or "" : the highest-priority one that serves `plan`);
// throws saying why each candidate refused when none can run it.
MESHRT_API const CommBackend& choose_collective_backend(const std::string& requested,
                                                        const WorldPlan& plan);

namespace detail {
// Called by the generated list of compiled-in backends (one call per backend).
void add_collective_backend(std::vector<CommBackend>& registry, CommBackend b);
}  // namespace detail

}  // namespace meshrt
