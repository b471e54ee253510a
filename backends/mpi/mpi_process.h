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

#include "backends/mpi/mpi_runtime.h"

namespace meshrt {

namespace detail {

// Words per process in the node-shared window: one per communicator (the sequence number it
// entered), then this process's activity: how many collective waits it is inside, and a
// heartbeat those waits update (steady-clock ns; ~0 once a wait gave up after an abort).
constexpr int kMpiWatchSlots = 1024;
constexpr int kMpiCommSlots = kMpiWatchSlots - 2;
constexpr int kMpiBusySlot = kMpiWatchSlots - 2;
constexpr int kMpiBeatSlot = kMpiWatchSlots - 1;

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

// Marks this process as waiting inside a collective while it lives (node-shared words), beats
// the heartbeat, and on destruction without finished() (an abort or timeout) leaves the process
// marked as having given up, which peers do not count as stalled.
class MpiWaitMark {
 public:
  MpiWaitMark();
  ~MpiWaitMark();
  void beat();
  void finished() { finished_ = true; }
  MpiWaitMark(const MpiWaitMark&) = delete;
  MpiWaitMark& operator=(const MpiWaitMark&) = delete;

 private:
  uint64_t* words_ = nullptr;
  bool finished_ = false;
};
// What node-local process `node_index` is doing: "waiting in another collective", "not inside
// any collective", "not responding" (its wait stopped polling: stopped or descheduled).
std::string mpi_rank_activity(int node_index);
// Global ranks on this node that are outside every collective or not responding.
std::vector<int> mpi_stalled_ranks();

// `n` as MPI's int count; throws naming `what` when it does not fit.
int mpi_int_count(int64_t n, const char* what);

}  // namespace detail

}  // namespace meshrt
