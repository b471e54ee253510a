// The flight recorder: each rank's ring of its last N collectives, written as JSON
// (meshrt-flight-<rank>.json in flight_dir()) on a watchdog timeout, an abort, a fatal signal
// (SIGTERM while the application stops gracefully on it, runtime/stop.h, only for a stuck rank:
// a collective open 1 s or more, or parked by a fault) or SIGUSR1;
// and the per-rank state (global rank, fault injection) that every communicator of one rank shares.
// Internal to collectives/.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/comm_impl.h"
#include "collectives/fault.h"
#include "runtime/plugin_api.h"

namespace meshrt::detail {

enum class FlightState : uint8_t { Issued = 0, Started, Completed, Failed, Skipped };
const char* flight_state_name(FlightState s);

// One collective as this rank saw it. Plain data (fixed-size names) so that recording costs no
// allocation. Times are steady-clock nanoseconds (CLOCK_MONOTONIC: comparable between the
// processes of one node), 0 when the point was not reached.
struct FlightEntry {
  uint64_t id = 0;   // 1, 2, ... per rank; slot id % capacity
  uint64_t gid = 0;  // group instance: equal on every member, distinct for same-named groups
  uint64_t seq = 0;  // the group's sequence number (send / recv: message number to / from peer)
  char group[48] = {};
  char stream[32] = {};
  char note[48] = {};  // an injected fault on this call, if any
  int group_rank = 0, group_size = 0;
  int root = -1, peer = -1;
  uint8_t op = 0, dtype = 0, redop = 0;
  FlightState state = FlightState::Issued;
  int64_t count = 0, bytes = 0;
  int64_t enqueue_ns = 0, start_ns = 0, end_ns = 0;
  // Group ranks (bit r, r < 64) whose data the MESHRT_COMM_DEBUG data check found wrong.
  uint64_t data_bad = 0;
};

class FlightRing {
 public:
  FlightRing(int rank, size_t capacity) : rank_(rank), slots_(capacity) {}
  ~FlightRing();
  FlightRing(const FlightRing&) = delete;
  FlightRing& operator=(const FlightRing&) = delete;
  int rank() const { return rank_; }
  // Records a call being issued; returns its id (for started / ended).
  uint64_t issue(const FlightEntry& e);
  void started(uint64_t id);
  void ended(uint64_t id, bool ok);
  // The data check of call `id` named these group ranks (collectives/data_check.h).
  void data_bad(uint64_t id, const std::vector<int>& group_ranks);
  void set_context(int world_size, std::string_view backend, std::string_view fault);
  // The record as JSON ("meshrt_flight": 1 ...), with `reason` and the time of the dump.
  std::string json(const std::string& reason) const;
  // Start time of the oldest call started and not ended (flight_now_ns), 0 when none.
  int64_t oldest_open_ns() const;

 private:
  FlightEntry* find(uint64_t id);  // with mu_ held
  int rank_;
  mutable std::mutex mu_;
  std::vector<FlightEntry> slots_;
  uint64_t next_ = 1;
  int world_size_ = 0;
  std::string backend_, fault_, job_;
};

// The job a record comes from, equal on every rank of one job (`meshrt doctor` refuses to merge
// records of different jobs): host:pid for thread ranks (backend "host"), else the launcher's job
// id (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, SLURM_JOB_ID.SLURM_STEP_ID); "" when unknown.
std::string flight_job_id(std::string_view backend);

// What every communicator of one rank shares: its global rank, its ring, the fault to inject.
struct RankState {
  int global_rank = 0;
  bool threads = false;              // ranks are threads of this process (host backend)
  std::shared_ptr<FlightRing> ring;  // null when MESHRT_FLIGHT=0
  FaultSpec fault;                   // active only on the rank it hits
  std::atomic<uint64_t> counted{0};  // collectives counted for fault steps
};

// A rank's state: a new ring (registered for dumps) unless MESHRT_FLIGHT=0, and the fault spec
// when it names this rank. `fault` was validated by CommConfig::from_env.
std::shared_ptr<RankState> make_rank_state(int global_rank, int world_size,
                                           std::string_view backend, const std::string& fault);

// Writes every live ring of this process to <flight_dir()>/meshrt-flight-<rank>.json and says in
// one line where; returns the paths written. Failures are logged, not thrown.
MESHRT_PLUGIN_API std::vector<std::string> flight_dump_all(const std::string& reason);
// An injected fault parked a rank of this process for good: a SIGTERM writes its record even
// while the application would stop gracefully (the rank never will).
MESHRT_PLUGIN_API void flight_mark_parked();
// The directory the records go to: MESHRT_FLIGHT_DIR, else the per-job folder
// ${TMPDIR:-/tmp}/meshrt-flight-<job id> (made on the first record), never the working directory.
std::string flight_dir();
// Refuses a MESHRT_FLIGHT_DIR that is not an existing, writable directory, at start (CommConfig::
// from_env): a record is written when something has already gone wrong, too late to say so.
void check_flight_dir_from_env();
// The job id every rank of one job shares: MESHRT_RUN_ID, TORCHELASTIC_RUN_ID,
// SLURM_JOB_ID[.SLURM_STEP_ID], Open MPI's job id (OMPI_MCA_ess_base_jobid), PMIX_NAMESPACE,
// else "pid<process id>" (threads); characters outside [A-Za-z0-9._-] become '_'.
std::string flight_job_id();

// Steady-clock nanoseconds now.
int64_t flight_now_ns();

}  // namespace meshrt::detail
