// MPI communicator: ranks are processes (mpirun / srun); CPU tensors move through non-blocking MPI.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace meshrt {

// The world communicator of this process (over a duplicate of MPI_COMM_WORLD). Collective over
// all processes. Tensors must be on the CPU.
std::unique_ptr<Communicator> make_mpi_world_communicator(
    CommConfig config = CommConfig::from_env());

}  // namespace meshrt
