// MESHRT_MPI_CHECK: the one check for MPI return codes (MPI_ERRORS_RETURN is set on our comms).
#pragma once

#include <mpi.h>

#include <string>

namespace meshrt::detail {

// Throws CommError: "<call> failed: <MPI error string> (MPI error class N)".
[[noreturn]] void mpi_fail(const char* call, int rc, const char* file, int line);

}  // namespace meshrt::detail

#define MESHRT_MPI_CHECK(call)                                               \
  do {                                                                       \
    int meshrt_mpi_rc_ = (call);                                             \
    if (meshrt_mpi_rc_ != MPI_SUCCESS) {                                     \
      ::meshrt::detail::mpi_fail(#call, meshrt_mpi_rc_, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)
