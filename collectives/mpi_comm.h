// MPI communicator: ranks are processes (mpirun / srun); CPU tensors move through non-blocking MPI.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace meshrt {

// Whether an MPI launcher started this process (mpirun / mpiexec / srun: OMPI_*, PMI_*, PMIX_*,
// SLURM step variables). Reads the environment only; does not initialise MPI.
bool mpi_launched();

// Initialises MPI with MPI_THREAD_MULTIPLE once per process (no-op when already initialised).
// MPI is finalised at exit; if a communicator was aborted (watchdog, error), the job is aborted
// with a non-zero exit instead, so that peers stuck in MPI cannot hang.
void mpi_init();
// Finalises now (or aborts the job, as above). Later MPI use is an error.
void mpi_finalize();
int mpi_world_rank();
int mpi_world_size();

// The world communicator of this process (over a duplicate of MPI_COMM_WORLD). Collective over
// all processes. Tensors must be on the CPU.
std::unique_ptr<Communicator> make_mpi_world_communicator(
    CommConfig config = CommConfig::from_env());

// Every process's `mine` (same size everywhere), in rank order; collective over the world.
// Gives up with CommError after the config's timeout.
std::vector<std::string> mpi_world_allgather(const std::string& mine,
                                             CommConfig config = CommConfig::from_env());

}  // namespace meshrt
