// NCCL communicator: one rank per GPU; collectives on CUDA tensors enqueued on CUDA streams.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace meshrt {

// The 128 opaque bytes of an ncclUniqueId, as plain data (shared in-process for ranks as threads,
// over MPI or the file rendezvous for ranks as processes).
struct NcclUniqueId {
  std::array<char, 128> bytes{};
};

// ncclGetUniqueId: made once (by rank 0) and handed to every rank.
NcclUniqueId nccl_unique_id();

// Rank `rank` of `size` on CUDA device `device`. Initialisation is non-blocking and collective:
// every rank must call this (from its own thread when ranks are threads); it gives up with
// CommError after the config's timeout. Collectives are watched by a background thread that
// polls ncclCommGetAsyncError and, on an error or a timeout, aborts every NCCL communicator of the
// process (ncclCommAbort); the next operation or the affected streams then raise CommError.
// bf16 / f16 reductions run in f32 (converted on the stream) unless
// MESHRT_NCCL_HALF_REDUCE=native.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int rank, int size,
                                                     int device, const std::string& name = "world",
                                                     CommConfig config = CommConfig::from_env());

// "2.28.9"
std::string nccl_version_string();

}  // namespace meshrt
