// The TCP backend ("tcp"): CPU ranks that are processes on any nodes, connected by sockets (two
// per pair of ranks: one for collectives, one for send / recv). It needs no MPI: the ranks find
// each other through the launch's rendezvous (collectives/bootstrap_transport.h), e.g. torch's
// store or MASTER_ADDR / MASTER_PORT. Collectives are ring reduce-scatter / all-gather (so
// all-reduce moves 2 (n-1)/n of the data per rank), pairwise all-to-all and a broadcast down a
// binomial tree (small) or along a pipelined ring (large): collectives/algorithms/table.cpp.
// The two-level backend (hier) uses it between nodes when MPI did not start the processes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace meshrt {

class BootstrapTransport;

// The world communicator of this process among `transport`'s processes. Collective: every rank
// listens on a port of its own (any interface), publishes "address:port" through the transport
// and connects to every lower rank; splits connect their members the same way. The address is
// chosen by choose_socket_address below from this host's interfaces, MESHRT_SOCKET_IFNAME and the
// address this process reaches the rendezvous from (TCP rendezvous).
// Every wait is bounded by config.timeout_s; a peer whose connection closes (its process died)
// is named at once. Throws CommError naming the rank and cause.
std::unique_ptr<Communicator> make_tcp_world_communicator(
    BootstrapTransport& transport, CommConfig config = CommConfig::from_env());

namespace detail {

// One IPv4 address of one network interface of this host (getifaddrs); an interface without an
// IPv4 address is listed once with `ipv4` empty.
struct NetInterface {
  std::string name;  // "eth0"
  std::string ipv4;  // "10.1.2.3", or "" when it has none
  bool up = false;
  bool loopback = false;
};

// This host's interfaces, in the system's order.
std::vector<NetInterface> host_interfaces();

// The address a tcp rank publishes, and why.
struct SocketAddress {
  std::string address;         // "10.1.2.3"
  std::string interface;       // "eth0"
  bool loopback_only = false;  // no other interface qualified: peers must be on this machine
};

// The choice, a pure function of the interfaces, MESHRT_SOCKET_IFNAME's value `ifname` (""
// unset) and the address the rendezvous connection uses ("" when the rendezvous cannot tell).
// Only interfaces that are up and have an IPv4 address qualify. `ifname` is a comma-separated
// list of interface name prefixes ("eth,ib"), each "=name" for an exact name, or the whole list
// after '^' to exclude those ("^docker,virbr"); unset, the list is "^docker,lo" with loopback
// as the last resort. Among the qualifying interfaces the rendezvous' own one wins, else the
// first in the system's order that is not loopback, else the first. A rendezvous over loopback
// (every rank on this machine) keeps its loopback address when `ifname` is unset. Throws
// meshrt::Error naming MESHRT_SOCKET_IFNAME, its value and the interfaces that exist when
// nothing qualifies under `ifname`.
SocketAddress choose_socket_address(const std::vector<NetInterface>& interfaces,
                                    const std::string& ifname, const std::string& rendezvous);

}  // namespace detail

}  // namespace meshrt
