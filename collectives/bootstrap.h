// Bootstrap: the one entry point that decides from the environment how ranks are laid out
// (threads of this process, or one process per rank), picks a registered collective backend and
// creates their world communicators.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/backend_registry.h"
#include "collectives/communicator.h"
#include "meshrt/export.h"
#include "runtime/device.h"

namespace meshrt {

struct MESHRT_API LaunchOptions {
  // Thread launches: one rank per device ("cpu:4", "cuda:0-7"). Process launches: the device
  // kind, or a list indexed by local rank ("cuda" means cuda:<local rank>).
  std::string devices = "cpu";
  // A registered backend's name (collectives/backend_registry.h), or auto: the highest-priority
  // backend that serves the launch (host for CPU threads, mpi for CPU processes, nccl for CUDA).
  std::string backend = "auto";
  CommConfig config = CommConfig::from_env();
  // `devices` is a command's default, not the user's choice: a process launch then takes only
  // its device kind (a default "cpu:2" means cpu). A thread count given by the user ("cpu:4")
  // is refused under a process launch, which runs one rank per process.
  bool devices_defaulted = false;
};

class MESHRT_API Launch {
 public:
  virtual ~Launch() = default;
  virtual LaunchKind kind() const = 0;
  // The registered name of the collective backend its communicators use.
  virtual const std::string& backend() const = 0;
  virtual int world_size() const = 0;
  // The ranks this process runs: all of them for threads, one for processes.
  virtual const std::vector<RankPlacement>& local() const = 0;
  // The world communicator of local()[i]; each may be taken once. For NCCL with ranks as threads
  // every rank's thread must call this at the same time (initialisation is collective).
  virtual std::unique_ptr<Communicator> world(int i) = 0;
  // Runs fn once per local rank (threads: one thread each; processes: the calling thread) with
  // its placement and world communicator, and sets the log rank. When a rank throws, the world
  // is aborted so the others fail fast instead of waiting (the abort writes the flight records);
  // the first error is rethrown. An AgreedError (runtime/error.h: every rank raises it at the same
  // point) aborts nothing: no rank is waiting, and a user's error is no fault to record.
  void run(const std::function<void(const RankPlacement&, Communicator&)>& fn);
  // The outcome of this process's checks before run() (`err`: their error, "" when they passed),
  // agreed among the processes of a process launch: a process that gave up would otherwise leave
  // the others waiting at run()'s rendezvous until the timeout. Throws AgreedError on every
  // process when any failed: its own `err`, else "rank N: " and the lowest failing rank's.
  // Threads (one process checks for all) and a lone process: throws `err` unless it is empty.
  virtual void agree_checks(const std::string& err);
  // "4 ranks as threads of this process, host backend"
  std::string describe() const;
};

// Decides the launch from the environment: MPI / Slurm variables -> one rank per process (MPI);
// RANK + WORLD_SIZE -> one rank per process meeting through MESHRT_RENDEZVOUS (file:///dir or
// tcp://host:port) or torchrun's MASTER_ADDR / MASTER_PORT; otherwise ranks are threads, one per
// entry of opts.devices. Throws, saying what to change, when the
// combination cannot work (e.g. CPU ranks as torchrun processes, host backend under mpirun).
MESHRT_API std::unique_ptr<Launch> bootstrap(const LaunchOptions& opts = {});

// MESHRT_RENDEZVOUS=file:///shared/dir -> "/shared/dir"; "" when unset or tcp://; throws on
// other forms.
MESHRT_API std::string rendezvous_dir_from_env();
// The TCP rendezvous address: MESHRT_RENDEZVOUS=tcp://host:port, else (MESHRT_RENDEZVOUS unset)
// MASTER_ADDR and MASTER_PORT + 1 (MASTER_PORT itself is torch's store). False when neither is
// set; throws naming the variable when a port is not one.
MESHRT_API bool rendezvous_tcp_from_env(std::string* host, int* port);

}  // namespace meshrt
