// The two-level algorithm ("two_level", collectives/algorithms/algorithm.h) of the hier backend:
// all-reduce, reduce-scatter and all-gather over two transports, the node's communicator (shm)
// and the communicator between the nodes (MPI under mpirun, TCP otherwise), each level working
// on the node's share of the data. hier_comm.cpp wires it into the engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace meshrt {
struct CommCall;
}

namespace meshrt::detail {

// Where the world's ranks run: nodes numbered in the order of their lowest rank.
struct NodeLayout {
  std::vector<std::vector<int>> nodes;  // node -> its global ranks, ascending
  std::vector<int> node_of, local_of;   // global rank -> its node, its index in that node
  bool uniform = true;                  // every node has as many ranks
  int nodes_n() const { return static_cast<int>(nodes.size()); }
  int ranks() const { return static_cast<int>(node_of.size()); }
};

// The layout of ranks whose node identities (detail::node_identity, in rank order) are `ids`.
NodeLayout node_layout(const std::vector<std::string>& ids);

// The parts of one rank's world: the flat world (inter-node transport), its node's group (every
// rank has one, of one rank on a node of one), and the group between the nodes: with as many
// ranks on every node, the "rail" of the ranks with this rank's index on each node; otherwise
// the nodes' first ranks ("leaders"; null on the others).
struct TwoLevelParts {
  std::shared_ptr<Communicator> flat, node, rail, leaders;
  NodeLayout lay;
  int rank = 0;
};

// Issues the validated call `c` in two levels on `s` (as calls of the parts' communicators) and
// returns true; false, issuing nothing, where two levels would not be exact or have nothing to
// split (the caller then runs it on the flat world): avg of integers or on unequal nodes (an
// average of averages), reduce-scatter / all-gather on unequal nodes, one rank per node.
bool two_level_issue(const TwoLevelParts& p, const CommCall& c, Stream& s);

}  // namespace meshrt::detail
