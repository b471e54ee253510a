// The two-level ("hier") backend's wiring: CPU ranks that are processes on several nodes.
// All-reduce, all-gather and reduce-scatter run in two levels (collectives/algorithms/
// two_level.h): shared memory inside each node (the shm backend), and between the nodes MPI when
// mpirun started the processes, else the tcp backend (a world bootstrapped over TCP or files:
// torchrun, torch's store); every other call goes to that flat world. Node identity:
// detail::node_identity (host name, MESHRT_NODE_ID).
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/two_level.h"
#include "collectives/backend_registry.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/comm_impl.h"
#include "collectives/data_check.h"
#include "collectives/flight.h"
#include "collectives/mpi_backend.h"
#include "collectives/shm_comm.h"
#include "collectives/tcp_comm.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

// The all-gather among one node's processes, over the world's transport: every rank of the
// world calls it (each for its own node) with the same key.
class NodeTransport final : public BootstrapTransport {
 public:
  NodeTransport(BootstrapTransport& world, std::vector<int> members, int rank)
      : world_(world), members_(std::move(members)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::vector<std::string> all_gather(const std::string& key, const std::string& mine) override {
    const std::vector<std::string> all = world_.all_gather("hier.node." + key, mine);
    std::vector<std::string> out;
    for (int g : members_) out.push_back(all[static_cast<size_t>(g)]);
    return out;
  }

 private:
  BootstrapTransport& world_;
  std::vector<int> members_;
  int rank_;
};

using detail::TwoLevelParts;

class HierImpl final : public CommImpl {
 public:
  HierImpl(TwoLevelParts p, const CommConfig& cfg)
      : p_(std::move(p)),
        plan_(detail::AlgoWorld{"hier", p_.lay.ranks(), p_.lay.nodes_n()}, cfg.algo) {}

  std::string_view backend() const override { return "hier"; }
  int nodes() const override { return p_.lay.nodes_n(); }
  bool aborted() const override { return p_.flat->aborted() || p_.node->aborted(); }
  std::string abort_reason() const override {
    return p_.flat->aborted() ? p_.flat->abort_reason() : p_.node->abort_reason();
  }
  void abort(const std::string& reason) override {
    p_.flat->abort(reason);
    p_.node->abort(reason);
  }

  void issue(CommCall call, Stream& s) override {
    std::lock_guard<std::mutex> lk(mu_);  // the inner calls keep this communicator's order
    const std::shared_ptr<detail::FlightRing> ring = call.flight;
    const uint64_t id = call.flight_id;
    if (ring) s.enqueue([ring, id] { ring->started(id); });
    if (!two_level(call, s)) flat_call(call, s);
    Event done = s.record();
    const bool corrupt = call.corrupt;
    Tensor out = call.out;
    const DType dt = call.dtype;
    std::shared_ptr<Communicator> flat = p_.flat, node = p_.node;
    s.enqueue([=] {
      bool ok = true;
      std::string why;
      try {
        done.synchronize();
      } catch (const std::exception& e) {
        ok = false;
        why = e.what();
      }
      if (ring) ring->ended(id, ok);
      // A failed level fails both (the other may have completed on this rank alone).
      if (!ok && !flat->aborted()) flat->abort(why);
      if (!ok && !node->aborted()) node->abort(why);
      if (ok && corrupt && out.defined() && out.numel() > 0)
        detail::corrupt_first_element(out.data_ptr(), dt);
    });
    last_[&s] = s.record();
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      uint64_t) override {
    // Sub-groups (a mesh's dims) run on the flat world (MPI or TCP); the child gets this world's
    // rank state.
    detail::InnerCommScope inner;
    return p_.flat->split(color, key, name);
  }

  void wait_issued(uint64_t, const std::unordered_map<int, uint64_t>&,
                   const std::unordered_map<int, uint64_t>&) override {
    std::vector<Event> evs;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [stream, e] : last_) evs.push_back(e);
    }
    for (Event& e : evs) {
      try {
        e.synchronize();
      } catch (const std::exception&) {  // the caller's events carry the error
      }
    }
  }

 private:
  TwoLevelParts p_;
  detail::AlgoPlan plan_;  // two_level or flat, per op and size (collectives/algorithms/)
  std::mutex mu_;
  std::map<const Stream*, Event> last_;  // the end of the last call issued on each stream

  bool two_level(const CommCall& c, Stream& s) {
    if (plan_.pick(c.op, c.bytes()) != &detail::algos::two_level) return false;
    return detail::two_level_issue(p_, c, s);
  }

  void flat_call(const CommCall& c, Stream& s) {
    Communicator& f = *p_.flat;
    switch (c.op) {
      case CommOp::AllReduce:
        f.all_reduce(c.in, c.out, c.redop, s);
        break;
      case CommOp::AllGather:
        f.all_gather(c.in, c.out, s);
        break;
      case CommOp::ReduceScatter:
        f.reduce_scatter(c.in, c.out, c.redop, s);
        break;
      case CommOp::Broadcast:
        f.broadcast(c.in, c.out, c.root, s);
        break;
      case CommOp::AllToAll:
        f.all_to_all(c.in, c.out, s);
        break;
      case CommOp::Send:
        f.send(c.in, c.peer, s);
        break;
      case CommOp::Recv:
        f.recv(c.out, c.peer, s);
        break;
      case CommOp::Barrier:
        f.barrier(s);
        break;
      case CommOp::Split:
        MESHRT_FAIL("hier backend: split is not issued on a stream");
    }
  }
};

std::string hier_refuses(const WorldPlan& plan) {
  if (plan.device_type != DeviceType::CPU) {
    return "it moves CPU tensors; CUDA devices need a GPU backend (nccl)";
  }
  if (plan.kind == LaunchKind::Threads) {
    return "its ranks are processes on several nodes; ranks that are threads of one process "
           "share memory already (host backend)";
  }
  const int local = plan.local.empty() ? 0 : plan.local[0].local_size;
  if (local == plan.world_size) {
    return "every rank runs on this node: the shm backend serves one node (two levels need "
           "ranks on two or more nodes, or MESHRT_NODE_ID to simulate them)";
  }
  return "";
}

// The parts, made collectively by every rank of the world; `inter` makes the flat world.
TwoLevelParts hier_parts(const WorldPlan& plan, const WorldFactory& inter) {
  BootstrapTransport& tr = *plan.transport;
  TwoLevelParts p;
  p.rank = tr.rank();
  p.lay = detail::node_layout(tr.all_gather("hier.nodes", detail::node_identity()));
  const int node = p.lay.node_of[static_cast<size_t>(p.rank)];
  const int local = p.lay.local_of[static_cast<size_t>(p.rank)];
  detail::InnerCommScope inner;  // the world made below records and injects for its parts
  p.flat = inter(0);
  const std::vector<int>& members = p.lay.nodes[static_cast<size_t>(node)];
  NodeTransport nt(tr, members, local);
  p.node = make_shm_world_communicator(nt, plan.config, members, "world/node");
  if (p.lay.uniform) {
    p.rail = p.flat->split(local, node, "world/rail");
  } else {
    p.leaders = p.flat->split(local == 0 ? 0 : kNoColor, node, "world/leaders");
  }
  return p;
}

WorldFactory hier_prepare(const WorldPlan& plan) {
  MESHRT_CHECK(plan.transport != nullptr,
               "hier backend: " << plan.str() << " has no rendezvous to find the nodes through");
  // Between the nodes: MPI's world when MPI numbered the ranks, else sockets.
  const bool mpi = plan.kind == LaunchKind::MpiProcesses;
  BootstrapTransport* tr = plan.transport;
  const CommConfig cfg = plan.config;
  const WorldFactory inter =
      mpi ? detail::mpi_backend().prepare(plan)
          : WorldFactory([tr, cfg](int) { return make_tcp_world_communicator(*tr, cfg); });
  const WorldPlan kept = plan;  // its transport lives as long as the launch
  return [kept, inter, mpi](int) -> std::unique_ptr<Communicator> {
    TwoLevelParts p = hier_parts(kept, inter);
    const int rank = p.rank, size = p.lay.ranks();
    MESHRT_LOG_DEBUG("hier backend: " << p.lay.nodes_n() << " nodes, " << (mpi ? "mpi" : "tcp")
                                      << " between them"
                                      << (p.lay.uniform ? " of equal size" : " of unequal sizes")
                                      << "; this rank is index " << p.node->rank() << " of "
                                      << p.node->size() << " on its node");
    return std::make_unique<Communicator>(rank, size, "world", Device::cpu(0), kept.config,
                                          std::make_unique<HierImpl>(std::move(p), kept.config));
  };
}

}  // namespace

namespace detail {

void register_hier_backend(std::vector<CommBackend>& registry) {
  add_collective_backend(registry, {"hier", 22, hier_refuses, hier_prepare});
}

}  // namespace detail

}  // namespace meshrt
