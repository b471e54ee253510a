// The MPI backend as the core sees it: one function table, whose functions live in the MPI
// backend (backends/mpi/: the only files that include <mpi.h>).
// Static builds link it in; libmeshrt.so loads it from libmeshrt-mpi.so (runtime/plugin.h) the
// first time an MPI launch needs it, so the core itself never depends on an MPI library.
#pragma once

#include <memory>
#include <string>

#include "collectives/backend_registry.h"
#include "collectives/bootstrap_transport.h"

namespace meshrt {

// Whether an MPI launcher started this process (mpirun / mpiexec / srun: OMPI_*, PMI_*, PMIX_*,
// SLURM step variables). Reads the environment only; does not initialise MPI or load the plugin.
bool mpi_launched();

}  // namespace meshrt

namespace meshrt::detail {

struct MpiBackend {
  // mpi_init() of backends/mpi/mpi_runtime.h: MPI_THREAD_MULTIPLE, finalised at exit.
  void (*init)();
  // The all-gather among the processes of an MPI launch (make_mpi_transport).
  // timeout_setting: what set timeout_s, named by the timeout error ("MESHRT_COMM_TIMEOUT",
  // "meshrt_comm_config.init_timeout_s").
  std::unique_ptr<BootstrapTransport> (*make_transport)(double timeout_s,
                                                        const char* timeout_setting);
  // Whether *mpi_comm (an MPI_Comm*) is MPI_COMM_WORLD or congruent with it: 0 yes, 1 the
  // comparison failed (not a valid communicator), 2 another group; `why` says why not.
  int (*check_world)(void* mpi_comm, std::string* why);
  // The world communicators of an MPI launch (the "mpi" collective backend's prepare).
  WorldFactory (*prepare)(const WorldPlan& plan);
  // "Open MPI v4.1.4" (MPI_Get_library_version's first line).
  std::string (*library_version)();
  // Another backend (shm, bootstrapped by MPI) failed for `why`: while MPI is live, the process
  // then ends through MPI_Abort at exit rather than MPI_Finalize, which would wait for peers that
  // may be gone. The first reason wins.
  void (*mark_aborted)(const std::string& why);
};

// The MPI backend: linked in, or loaded from libmeshrt-mpi.so on the first call (which throws a
// one-line Error naming the library and dlerror()'s reason when it cannot be loaded).
const MpiBackend& mpi_backend();
// The backend when it is linked in or already loaded, else nullptr (never loads the plugin).
const MpiBackend* mpi_backend_if_loaded();
// Where the backend comes from: "linked in", the plugin's path once loaded, "" before.
std::string mpi_backend_origin();

}  // namespace meshrt::detail
