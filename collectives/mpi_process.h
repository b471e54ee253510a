// The MPI runtime's process-wide state, shared with the MPI communicator engine: the abort
// state, buried buffers and the node-shared words the watchdog reads to name missing ranks.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/mpi_runtime.h"

namespace meshrt {

namespace detail {

// Number of communicators whose progress other local ranks can see.
constexpr int kMpiWatchSlots = 1024;

// Process-wide MPI state (one per process, never destroyed: the exit handler uses it).
struct MpiProcess {
  std::mutex mu;
  bool we_initialized = false;
  bool finalized = false;
  std::atomic<bool> aborted{false};
  std::string reason;
  // Buffers of requests that never completed: MPI may still write into them.
  std::vector<std::shared_ptr<void>> graveyard;
  // Node-shared words: for each process on this node, kMpiWatchSlots "entered seq" counters, so
  // a rank that times out can tell which local peers never arrived.
  MPI_Comm node_comm = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  std::vector<uint64_t*> node_words;  // by node-local index
  std::vector<int> world_to_node;     // world rank -> node-local index, -1 on another node
  int my_node_index = -1;
  int next_slot = 0;
};
MpiProcess& mpi_process();

// Marks every MPI communicator of the process failed (the first reason wins).
void mpi_process_abort(const std::string& why);
std::string mpi_abort_reason();
// Keeps `buffers` alive for the rest of the process (a request using them never completed).
void mpi_bury(std::shared_ptr<void> buffers);
// Whether MPI is initialised and not yet finalised.
bool mpi_live();
// Sets up the node-shared watch words once (call with mpi_process().mu held); without them the
// watchdog still works but cannot name missing ranks.
void mpi_setup_watch_window();

// `n` as MPI's int count; throws naming `what` when it does not fit.
int mpi_int_count(int64_t n, const char* what);

}  // namespace detail

}  // namespace meshrt
