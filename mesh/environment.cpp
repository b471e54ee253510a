#include "mesh/environment.h"

#include <string>

#include "collectives/bootstrap.h"
#include "collectives/communicator.h"
#include "kernels/backend.h"
#include "runtime/env.h"

namespace meshrt {

void validate_environment() {
  check_environment();
  (void)CommConfig::from_env();
  if (!env_or("MESHRT_RENDEZVOUS").empty()) {
    (void)rendezvous_dir_from_env();  // refuses a scheme other than file:// and tcp://
    std::string host;
    int port = 0;
    (void)rendezvous_tcp_from_env(&host, &port);  // a tcp:// address without host or port
  }
  // Parsed on every check (the variant itself is decided once per process, on first use).
  (void)kernels::host::parse_host_isa_cap(env_or("MESHRT_HOST_ISA").c_str());
}

}  // namespace meshrt
