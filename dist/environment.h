// The one check of meshrt's environment, run where a program enters meshrt: every command of the
// command line (bench::check_process_environment), meshrt_init and every meshrt_comm_init* /
// meshrt_comm_adopt_nccl of the C API. It sits in dist/, the lowest layer that sees both the
// kernels' variables and the collectives'.
//
// Inline, in this header only: the standalone benchmark programs link the collectives and the
// kernels but not meshrt_dist.
#pragma once

#include <string>

#include "collectives/bootstrap.h"
#include "collectives/communicator.h"
#include "collectives/tcp_comm.h"
#include "kernels/backend.h"
#include "runtime/env.h"

namespace meshrt {

// Checks every MESHRT_ variable the library reads, before any of them is read where a refusal
// could not be returned (a stream's worker thread, an exit handler): the table's switches, choices
// and whole numbers and MESHRT_LOG_LEVEL (runtime/env.h's check_environment), then the free-form
// ones through their own readers: MESHRT_COMM_TIMEOUT, MESHRT_FAULT, MESHRT_ALGO and
// MESHRT_FLIGHT_DIR (CommConfig::from_env), MESHRT_RENDEZVOUS, MESHRT_SOCKET_IFNAME (against this
// host's interfaces) and MESHRT_HOST_ISA. Throws
// meshrt::Error naming the variable, its value and what is accepted; warns once about MESHRT_ names
// it does not know. (MESHRT_BACKEND_PATH and MESHRT_RUN_ID take any value.)
inline void validate_environment() {
  check_environment();
  (void)CommConfig::from_env();
  if (!env_or("MESHRT_RENDEZVOUS").empty()) {
    (void)rendezvous_dir_from_env();  // refuses a scheme other than file:// and tcp://
    std::string host;
    int port = 0;
    (void)rendezvous_tcp_from_env(&host, &port);  // a tcp:// address without host or port
  }
  if (const std::string ifname = env_or("MESHRT_SOCKET_IFNAME"); !ifname.empty())
    (void)detail::choose_socket_address(detail::host_interfaces(), ifname, "");
  // Parsed on every check (the variant itself is decided once per process, on first use).
  (void)kernels::host::parse_host_isa_cap(env_or("MESHRT_HOST_ISA").c_str());
}

}  // namespace meshrt
