// Shared-memory communicator: ranks are processes on one node (torchrun, mpirun, an engine's
// workers) that move CPU tensors through one POSIX shared-memory segment per communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace meshrt {

class BootstrapTransport;

// The world communicator of this process among `transport`'s processes, which must all run on
// this node. Collective: rank 0 creates the segment (a per-job unique name, O_EXCL), the name and
// every rank's pid go through the transport, and rank 0 unlinks the segment once every rank
// mapped it, so no segment outlives the job however it ends. Throws naming the rank and cause.
// When the transport's processes are part of a larger job (one node of it), `global_ranks` gives
// each one's rank in the job, for messages, and `name` the group's name.
std::unique_ptr<Communicator> make_shm_world_communicator(
    BootstrapTransport& transport, CommConfig config = CommConfig::from_env(),
    std::vector<int> global_ranks = {}, std::string name = "world");

namespace detail {
// Removes the /dev/shm segments of meshrt jobs whose creating process is gone (left only when
// a job was killed while its ranks were still mapping the segment); returns their names.
std::vector<std::string> shm_remove_stale_segments();
}  // namespace detail

}  // namespace meshrt
