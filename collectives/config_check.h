// Start-up agreement on a configuration: ranks launched with different options would otherwise
// run mismatched collectives (MPI then reads out of bounds) or hang until the watchdog.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"

namespace meshrt::detail {

using ConfigFields = std::vector<std::pair<std::string, std::string>>;

// Collective over `world` (a CPU world; on other devices it returns without checking): every
// rank passes the (name, value) fields it was started with. Throws meshrt::Error naming each
// field that differs and every rank's value of it ("hidden: rank 0 has 64, rank 1 has 128"),
// whether or not MESHRT_COMM_DEBUG is set. `what` names the command in the message.
void check_same_config(Communicator& world, const ConfigFields& fields, const std::string& what);

// The configuration this process was started with (set once by the command line, before its
// ranks start): Launch::run checks it across the ranks of a process launch (mpirun, srun) before
// it runs anything, naming what differs. Threads of one process share it: never checked there.
void set_process_config(ConfigFields fields, std::string what);
// Checks the process configuration across `world` (nothing when none was set).
void check_process_config(Communicator& world);

// The message for the fields of every rank ("" when they agree). Pure: the testable part.
std::string config_mismatch(const std::vector<ConfigFields>& by_rank, const std::string& what);

}  // namespace meshrt::detail
