// The file rendezvous (collectives/bootstrap_transport.h): a rank's file as another process (or
// a stale job) left it, read for a world size taken from the first byte; and MESHRT_RENDEZVOUS.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "collectives/bootstrap.h"
#include "collectives/bootstrap_transport.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world = 1 + data[0];
  const std::string contents(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const std::string payload =
        meshrt::detail::rendezvous_payload(contents, world, "dir/meshrt.run.hosts.1");
    // A well-formed file round-trips.
    if (meshrt::detail::rendezvous_file(world, payload) != contents) __builtin_trap();
  } catch (const meshrt::Error&) {
  }
  const std::string env = contents.substr(0, contents.find('\0'));
  ::setenv("MESHRT_RENDEZVOUS", env.c_str(), 1);
  try {
    meshrt::rendezvous_dir_from_env();
  } catch (const meshrt::Error&) {
  }
  try {
    std::string host;
    int port = 0;
    meshrt::rendezvous_tcp_from_env(&host, &port);
  } catch (const meshrt::Error&) {
  }
  ::unsetenv("MESHRT_RENDEZVOUS");
  return 0;
}
