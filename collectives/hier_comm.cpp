// The two-level ("hier") backend: CPU ranks that are processes on several nodes under mpirun.
// All-reduce, all-gather and reduce-scatter run in two levels, shared memory inside each node
// (the shm backend) and MPI between the nodes on the node's share of the data; every other call
// goes to the flat MPI world. Node identity: detail::node_identity (host name, MESHRT_NODE_ID).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "collectives/backend_registry.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/comm_impl.h"
#include "collectives/data_check.h"
#include "collectives/flight.h"
#include "collectives/mpi_backend.h"
#include "collectives/shm_comm.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

// Where the world's ranks run: nodes numbered in the order of their lowest rank.
struct NodeLayout {
  std::vector<std::vector<int>> nodes;  // node -> its global ranks, ascending
  std::vector<int> node_of, local_of;   // global rank -> its node, its index in that node
  bool uniform = true;                  // every node has as many ranks
  int nodes_n() const { return static_cast<int>(nodes.size()); }
};

NodeLayout hier_layout(const std::vector<std::string>& ids) {
  NodeLayout lay;
  std::map<std::string, int> index;
  for (size_t g = 0; g < ids.size(); ++g) {
    auto [it, fresh] = index.emplace(ids[g], lay.nodes_n());
    if (fresh) lay.nodes.emplace_back();
    lay.node_of.push_back(it->second);
    lay.local_of.push_back(static_cast<int>(lay.nodes[static_cast<size_t>(it->second)].size()));
    lay.nodes[static_cast<size_t>(it->second)].push_back(static_cast<int>(g));
  }
  for (const auto& n : lay.nodes) lay.uniform = lay.uniform && n.size() == lay.nodes[0].size();
  return lay;
}

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

// A contiguous run of `t`'s elements (a view).
Tensor hier_part(const Tensor& t, int64_t start, int64_t len) {
  return t.view(Shape{t.numel()}).narrow(0, start, len);
}

// A host buffer of `n` elements, freed with its last view.
Tensor hier_scratch(int64_t n, DType dt) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dt);
  void* p = std::malloc(bytes);
  MESHRT_CHECK(p != nullptr,
               "hier backend: cannot allocate " << bytes << " bytes of staging memory");
  return Tensor::from_blob(p, Shape{n}, dt, Device::cpu(0), [](void* q) { std::free(q); });
}

// The parts of one rank's world: the flat MPI world, its node's shm group (every rank has one,
// of one rank on a node of one), and the MPI group between the nodes: with as many ranks on
// every node, the "rail" of the ranks with this rank's index on each node; otherwise the nodes'
// first ranks ("leaders"; null on the others).
struct HierParts {
  std::shared_ptr<Communicator> flat, node, rail, leaders;
  NodeLayout lay;
  int rank = 0;
};

class HierImpl final : public CommImpl {
 public:
  HierImpl(HierParts p, const CommConfig& cfg)
      : p_(std::move(p)),
        plan_(detail::AlgoWorld{"hier", static_cast<int>(p_.lay.node_of.size()), p_.lay.nodes_n()},
              cfg.algo) {}

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
    // Sub-groups (a mesh's dims) run flat over MPI; the child gets this world's rank state.
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
  HierParts p_;
  detail::AlgoPlan plan_;  // two_level or flat, per op and size (collectives/algorithms/)
  std::mutex mu_;
  std::map<const Stream*, Event> last_;  // the end of the last call issued on each stream

  int local() const { return p_.lay.local_of[static_cast<size_t>(p_.rank)]; }
  int per_node() const { return p_.node->size(); }

  // Avg in two levels is the average of the nodes' averages: exact only for floats on equal
  // nodes (integer averages truncate at each level), so other cases run flat.
  bool levels_fit(const CommCall& c) const {
    if (p_.lay.nodes_n() == static_cast<int>(p_.lay.node_of.size())) return false;  // 1 per node
    if (c.redop != ReduceOp::Avg) return true;
    return p_.lay.uniform && is_floating(c.dtype);
  }

  bool two_level(const CommCall& c, Stream& s) {
    if (plan_.pick(c.op, c.bytes()) != &detail::algos::two_level) return false;
    switch (c.op) {
      case CommOp::AllReduce:
        if (!levels_fit(c)) return false;
        return p_.lay.uniform ? all_reduce_rail(c, s) : all_reduce_leaders(c, s);
      case CommOp::ReduceScatter:
        if (!levels_fit(c) || !p_.lay.uniform || c.count == 0) return false;
        reduce_scatter_rail(c, s);
        return true;
      case CommOp::AllGather:
        if (!levels_fit(c) || !p_.lay.uniform || c.count == 0) return false;
        all_gather_rail(c, s);
        return true;
      default:
        return false;
    }
  }

  // Equal nodes of L ranks: the node's reduce-scatter leaves each rank 1/L of the node's sum,
  // the rail all-reduces that share across the nodes, the node's all-gather assembles it; the
  // last count % L elements go over the flat world.
  bool all_reduce_rail(const CommCall& c, Stream& s) {
    const int64_t L = per_node(), per = c.count / L, main = per * L;
    if (per == 0) return false;
    const Tensor mine = hier_part(c.out, per * local(), per);
    p_.node->reduce_scatter(hier_part(c.in, 0, main), mine, c.redop, s);
    p_.rail->all_reduce(mine, c.redop, s);
    p_.node->all_gather(mine, hier_part(c.out, 0, main), s);
    if (main < c.count) {
      p_.flat->all_reduce(hier_part(c.in, main, c.count - main),
                          hier_part(c.out, main, c.count - main), c.redop, s);
    }
    return true;
  }

  // Unequal nodes: the node all-reduces, the nodes' first ranks all-reduce the node sums over
  // MPI, and each node's first rank broadcasts the result in the node.
  bool all_reduce_leaders(const CommCall& c, Stream& s) {
    p_.node->all_reduce(c.in, c.out, c.redop, s);
    if (p_.leaders) p_.leaders->all_reduce(c.out, c.redop, s);
    p_.node->broadcast(c.out, 0, s);
    return true;
  }

  // Position of global rank g's block in the rail-major order [local index][node].
  int64_t rail_major(int g) const {
    return static_cast<int64_t>(p_.lay.local_of[static_cast<size_t>(g)]) * p_.lay.nodes_n() +
           p_.lay.node_of[static_cast<size_t>(g)];
  }

  // Moves `n` blocks of `block` elements between global-rank order and rail-major order.
  void permute(Stream& s, const Tensor& from, const Tensor& to, int64_t block, bool to_rail) {
    std::vector<int64_t> where(p_.lay.node_of.size());
    for (size_t g = 0; g < where.size(); ++g) where[g] = rail_major(static_cast<int>(g));
    const size_t bytes = static_cast<size_t>(block) * dtype_size(from.dtype());
    s.enqueue([from, to, where, bytes, to_rail] {
      const char* src = static_cast<const char*>(from.data_ptr());
      char* dst = static_cast<char*>(to.data_ptr());
      for (size_t g = 0; g < where.size(); ++g) {
        const size_t a = g * bytes, b = static_cast<size_t>(where[g]) * bytes;
        std::memcpy(dst + (to_rail ? b : a), src + (to_rail ? a : b), bytes);
      }
    });
  }

  // Blocks reordered rail-major; the node's reduce-scatter leaves each rank its rail's blocks
  // summed over the node; the rail's reduce-scatter (ranks in node order) sums them across nodes.
  void reduce_scatter_rail(const CommCall& c, Stream& s) {
    const int64_t n = static_cast<int64_t>(p_.lay.node_of.size()), K = p_.lay.nodes_n();
    Tensor staged = hier_scratch(n * c.count, c.dtype), rail = hier_scratch(K * c.count, c.dtype);
    permute(s, c.in, staged, c.count, true);
    p_.node->reduce_scatter(staged, rail, c.redop, s);
    p_.rail->reduce_scatter(rail, c.out, c.redop, s);
  }

  // The rail gathers the blocks of this rank's index from every node, the node gathers the
  // rails, and the blocks are put back in global-rank order.
  void all_gather_rail(const CommCall& c, Stream& s) {
    const int64_t n = static_cast<int64_t>(p_.lay.node_of.size()), K = p_.lay.nodes_n();
    Tensor rail = hier_scratch(K * c.count, c.dtype), staged = hier_scratch(n * c.count, c.dtype);
    p_.rail->all_gather(c.in, rail, s);
    p_.node->all_gather(rail, staged, s);
    permute(s, staged, c.out, c.count, false);
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
  if (plan.kind != LaunchKind::MpiProcesses) {
    return "it needs MPI between the nodes: launch with mpirun -np N (this process was not "
           "started by an MPI launcher)";
  }
  const int local = plan.local.empty() ? 0 : plan.local[0].local_size;
  if (local == plan.world_size) {
    return "every rank runs on this node: the shm backend serves one node (two levels need "
           "ranks on two or more nodes, or MESHRT_NODE_ID to simulate them)";
  }
  return "";
}

// The parts, made collectively by every rank of the world.
HierParts hier_parts(const WorldPlan& plan, const WorldFactory& mpi) {
  BootstrapTransport& tr = *plan.transport;
  HierParts p;
  p.rank = tr.rank();
  p.lay = hier_layout(tr.all_gather("hier.nodes", detail::node_identity()));
  const int node = p.lay.node_of[static_cast<size_t>(p.rank)];
  const int local = p.lay.local_of[static_cast<size_t>(p.rank)];
  detail::InnerCommScope inner;  // the world made below records and injects for its parts
  p.flat = mpi(0);
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
  const WorldFactory mpi = detail::mpi_backend().prepare(plan);
  const WorldPlan kept = plan;  // its transport lives as long as the launch
  return [kept, mpi](int) -> std::unique_ptr<Communicator> {
    HierParts p = hier_parts(kept, mpi);
    const int rank = p.rank, size = static_cast<int>(p.lay.node_of.size());
    MESHRT_LOG_DEBUG("hier backend: " << p.lay.nodes_n() << " nodes"
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
