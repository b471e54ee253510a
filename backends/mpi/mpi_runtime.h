// The MPI process runtime: initialisation, finalisation and the world (launch detection,
// mpi_launched(), is the core's: collectives/mpi_backend.h).
#pragma once

#include "collectives/mpi_backend.h"

namespace meshrt {

// Initialises MPI with MPI_THREAD_MULTIPLE once per process (no-op when already initialised).
// MPI is finalised at exit; if a communicator was aborted (watchdog, error), the job is aborted
// with a non-zero exit instead, so that peers stuck in MPI cannot hang.
void mpi_init();
// Finalises now (or aborts the job, as above). Later MPI use is an error.
void mpi_finalize();
int mpi_world_rank();
int mpi_world_size();

}  // namespace meshrt
