// The core's side of the MPI backend: launch detection (the environment only) and the "mpi" entry
// of the collective-backend registry, whose refusals need no MPI library; preparing a world goes
// through the backend's table (collectives/mpi_backend.h), loading it when it is a plugin.
#include "collectives/mpi_backend.h"

#include <cstdlib>
#include <vector>

namespace meshrt {

bool mpi_launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                        "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"}) {
    if (const char* x = std::getenv(v); x && *x) return true;
  }
  // Inside an srun job step (not merely inside an allocation).
  return std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS");
}

namespace detail {

namespace {

std::string mpi_refuses(const WorldPlan& plan) {
  if (plan.device_type != DeviceType::CPU) {
    return "it moves CPU tensors; CUDA devices need a GPU backend (nccl)";
  }
  if (plan.kind == LaunchKind::EnvProcesses && mpi_launched()) {
    // Under mpirun, but the ranks met through a file rendezvous (meshrt_comm_init_file,
    // RANK / WORLD_SIZE): MPI did not number them, so its world need not be theirs.
    return "its ranks are MPI's own, but these processes met through a rendezvous "
           "(meshrt_comm_init_file, or RANK / WORLD_SIZE) although an MPI launcher started them: "
           "use meshrt_comm_init_mpi under mpirun, or the shm backend for CPU processes";
  }
  if (plan.kind != LaunchKind::MpiProcesses) {
    return "it needs one process per rank: launch with mpirun -np N (this process was not "
           "started by an MPI launcher)";
  }
  return "";
}

WorldFactory mpi_prepare(const WorldPlan& plan) { return mpi_backend().prepare(plan); }

}  // namespace

void register_mpi_backend(std::vector<CommBackend>& registry) {
  add_collective_backend(registry, {"mpi", 20, mpi_refuses, mpi_prepare});
}

}  // namespace detail

}  // namespace meshrt
