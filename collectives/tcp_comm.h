// The TCP backend ("tcp"): CPU ranks that are processes on any nodes, connected by sockets (two
// per pair of ranks: one for collectives, one for send / recv). It needs no MPI: the ranks find
// each other through the launch's rendezvous (collectives/bootstrap_transport.h), e.g. torch's
// store or MASTER_ADDR / MASTER_PORT. Collectives are ring reduce-scatter / all-gather (so
// all-reduce moves 2 (n-1)/n of the data per rank), pairwise all-to-all and a linear broadcast.
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
// the one this process reaches the rendezvous from (TCP rendezvous), else its host name's.
// Every wait is bounded by config.timeout_s; a peer whose connection closes (its process died)
// is named at once. Throws CommError naming the rank and cause.
std::unique_ptr<Communicator> make_tcp_world_communicator(
    BootstrapTransport& transport, CommConfig config = CommConfig::from_env());

}  // namespace meshrt
