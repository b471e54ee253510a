// BootstrapTransport: an all-gather of small byte blobs among the process ranks of a launch, for
// what must be exchanged before any communicator exists (host names, NCCL's unique id).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/launch_names.h"

namespace meshrt {

class BootstrapTransport {
 public:
  virtual ~BootstrapTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine` (any length), in rank order. Collective: every rank calls it with the
  // same `key`, and uses a key once per launch. Gives up with CommError, naming the ranks that
  // never arrived where the transport can tell, after its timeout.
  virtual std::vector<std::string> all_gather(const std::string& key, const std::string& mine) = 0;
  // The IPv4 address this process reaches its peers from ("10.0.0.5"), where the transport
  // knows it (TCP: its connection's local end); "" otherwise.
  virtual std::string local_address() const { return ""; }
};

// Exchanges through a directory every rank can see: rank r writes <dir>/meshrt.<run>.<key>.<r>
// atomically (temporary file + rename), then polls with backoff until all `size` files exist or
// `timeout_s` passes (then the error names the ranks whose files never appeared). `run`
// (MESHRT_RUN_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID by default) keeps separate jobs in one
// directory apart. Each rank removes its file once every rank acknowledged reading it. Messages
// name the launch's settings as `names` says.
std::unique_ptr<BootstrapTransport> make_file_transport(const std::string& dir, int rank, int size,
                                                        double timeout_s,
                                                        const std::string& run = "",
                                                        const LaunchNames& names = {});

namespace detail {
// The file format of the file transport: "meshrt-rendezvous world=<world>\n" then the payload.
std::string rendezvous_file(int world, const std::string& payload);
// The payload of a rendezvous file read from `path`; throws naming it when it was written for
// another world size or is not a rendezvous file (and `world_size`, the setting to check).
std::string rendezvous_payload(const std::string& contents, int world, const std::string& path,
                               const std::string& world_size = "WORLD_SIZE");
}  // namespace detail

// Over TCP: rank 0 listens on host:port (host: its address, as every rank reaches it), the other
// ranks connect (retrying until rank 0 listens) and keep their connection for the launch; each
// all-gather goes through rank 0. Waits are bounded by `timeout_s`: a rank that never connects
// is named, as is one whose connection closes (its process failed). Messages name the launch's
// settings as `names` says.
std::unique_ptr<BootstrapTransport> make_tcp_transport(const std::string& host, int port, int rank,
                                                       int size, double timeout_s,
                                                       const LaunchNames& names = {});

// Over MPI_COMM_WORLD (initialising MPI if needed); gives up after `timeout_s` and then aborts the
// MPI communicators of the process, like a collective timeout. Defined with the MPI runtime.
std::unique_ptr<BootstrapTransport> make_mpi_transport(double timeout_s,
                                                       const char* timeout_setting);

}  // namespace meshrt
