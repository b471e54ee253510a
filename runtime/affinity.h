// Binding the rank threads meshrt starts (ranks as threads of one process) to disjoint sets of
// the cores this process may use, so that each rank's issuing thread, stream workers and pool
// threads share its cores and the ranks of a collective never wait on a core another rank holds.
// MESHRT_HOST_BIND: auto (default) binds when 1 < ranks <= usable cores; none never binds.
// Threads meshrt does not start (an engine's, through the C API) are never bound.
#pragma once

#include <sched.h>

#include <vector>

namespace meshrt {

// The cores of this process's affinity mask (the main thread's), in increasing order; empty when
// the OS does not say.
std::vector<int> process_cores();
// The cores of the calling thread's mask (a bound rank's share), the same way.
std::vector<int> thread_cores();

// One core set per rank (rank r: the r-th contiguous share of process_cores()), or none when the
// ranks are not to be bound: MESHRT_HOST_BIND=none, one rank, or more ranks than cores.
std::vector<cpu_set_t> rank_core_sets(int ranks);

// Binds the calling thread (and the threads it starts later) to `set`. A refusal by the OS is
// logged at warn level with its errno and the thread runs unbound: binding is a placement hint.
void bind_this_thread(const cpu_set_t& set, int rank);

}  // namespace meshrt
