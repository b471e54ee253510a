// Start-up agreement on a configuration: ranks launched with different options would otherwise
// run mismatched collectives (MPI then reads out of bounds) or hang until the watchdog.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/bootstrap_transport.h"
#include "runtime/error.h"

namespace meshrt::detail {

using ConfigFields = std::vector<std::pair<std::string, std::string>>;

// Ranks started with different configurations: every rank raises the same message (so a command
// line prints it once; an AgreedError: no rank waits for another).
class ConfigMismatchError : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// Collective over `t` (any device: it runs before one is chosen): every rank passes the
// (name, value) fields it was started with; the environment settings every rank must share
// (runtime/env.h's env_rank_shared_settings: MESHRT_COMM_DEBUG, ...) are added to them. Throws
// ConfigMismatchError naming each field that differs and every rank's value of it ("hidden: rank
// 0 has 64, rank 1 has 128", "MESHRT_COMM_DEBUG: rank 0 has off, rank 1 has on"), whether or not
// MESHRT_COMM_DEBUG is set. `what` names the command in the message.
void check_same_config(BootstrapTransport& t, const ConfigFields& fields, const std::string& what);

// The configuration this process was started with (set once by the command line, before its
// ranks start): bootstrap() checks it across the ranks of a process launch (mpirun, srun,
// torchrun-style) on its transport before anything else (devices, backends), naming what
// differs. Threads of one process share it: never checked there.
void set_process_config(ConfigFields fields, std::string what);
// Checks the process configuration across the ranks of `t`, once per process (nothing when none
// was set, or when it was checked already).
void check_process_config(BootstrapTransport& t);
// Whether a process configuration was set and not yet checked (an error before the bootstrap
// must still take part in the check, or the ranks that passed would wait for it).
bool process_config_unchecked();
// This process failed before its configuration was checked (its options' checks, its
// environment, its files): `error` (the message) joins its fields as kConfigFailure, so the check
// names the failing rank and its error rather than the fields it had not set yet.
void set_process_failure(const std::string& error);
inline constexpr const char* kConfigFailure = "failed";
// For an error raised before the bootstrap of a process launch (bootstrap.cpp): makes the
// launch's transport and checks the process configuration (throws ConfigMismatchError), so the
// ranks that got past the error do not wait for this one. Nothing on thread launches or once
// checked.
void check_process_config_early(double timeout_s);

// The message for the fields of every rank ("" when they agree). Pure: the testable part. Fields
// that differ are named with every rank's value; a field a failed rank (one with kConfigFailure)
// never set does not count. When no field differs but a rank failed: "... did not all start
// (rank 1 failed: <its error>)".
std::string config_mismatch(const std::vector<ConfigFields>& by_rank, const std::string& what);

}  // namespace meshrt::detail
