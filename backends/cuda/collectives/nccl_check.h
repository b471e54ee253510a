// MESHRT_NCCL_CHECK: the one check for NCCL return codes. ncclInProgress is not an error (the
// communicators are non-blocking); the macro yields the result so the caller can wait for it.
#pragma once

#include <nccl.h>

namespace meshrt::detail {

// Throws CommError: "<call> failed: <ncclGetErrorString> (<ncclGetLastError>) [file:line]".
[[noreturn]] void nccl_fail(const char* call, ncclResult_t r, ncclComm_t comm, const char* file,
                            int line);

inline ncclResult_t nccl_check(ncclResult_t r, const char* call, ncclComm_t comm, const char* file,
                               int line) {
  if (r != ncclSuccess && r != ncclInProgress) nccl_fail(call, r, comm, file, line);
  return r;
}

}  // namespace meshrt::detail

// if (MESHRT_NCCL_CHECK(ncclAllReduce(...), comm) == ncclInProgress) wait_for(comm);
#define MESHRT_NCCL_CHECK(call, comm) \
  ::meshrt::detail::nccl_check((call), #call, (comm), __FILE__, __LINE__)
