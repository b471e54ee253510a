// Rank threads bound to disjoint core sets (runtime/affinity.h).
#include "runtime/affinity.h"

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/env.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

// The cores in the mask of thread `tid` (0: the caller).
std::vector<int> cores_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cores;
  if (sched_getaffinity(tid, sizeof(set), &set) != 0) {
    MESHRT_LOG_DEBUG("affinity: sched_getaffinity(" << tid << ") failed: " << std::strerror(errno));
    return cores;
  }
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

}  // namespace

std::vector<int> process_cores() { return cores_of(getpid()); }

std::vector<int> thread_cores() { return cores_of(0); }

std::vector<cpu_set_t> rank_core_sets(int ranks) {
  std::vector<cpu_set_t> sets;
  if (ranks <= 1 || env_choice("MESHRT_HOST_BIND") == "none") return sets;
  const std::vector<int> cores = process_cores();
  const int n = static_cast<int>(cores.size());
  if (ranks > n) return sets;  // more ranks than cores: the OS places them
  sets.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    cpu_set_t& s = sets[static_cast<size_t>(r)];
    CPU_ZERO(&s);
    for (int i = r * n / ranks; i < (r + 1) * n / ranks; ++i)
      CPU_SET(cores[static_cast<size_t>(i)], &s);
  }
  return sets;
}

void bind_this_thread(const cpu_set_t& set, int rank) {
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    MESHRT_LOG_WARN("rank " << rank << ": binding its threads to " << CPU_COUNT(&set)
                            << " core(s) failed (" << std::strerror(rc)
                            << "); it runs unbound (MESHRT_HOST_BIND=none skips binding)");
  }
}

}  // namespace meshrt
