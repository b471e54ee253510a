// The two-level algorithm (collectives/algorithms/two_level.h).
#include "collectives/algorithms/two_level.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "collectives/comm_impl.h"
#include "runtime/error.h"

namespace meshrt::detail {

namespace {

// A contiguous run of `t`'s elements (a view).
Tensor part(const Tensor& t, int64_t start, int64_t len) {
  return t.view(Shape{t.numel()}).narrow(0, start, len);
}

// A host buffer of `n` elements, freed with its last view.
Tensor scratch(int64_t n, DType dt) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dt);
  void* p = std::malloc(bytes);
  MESHRT_CHECK(p != nullptr,
               "hier backend: cannot allocate " << bytes << " bytes of staging memory");
  return Tensor::from_blob(p, Shape{n}, dt, Device::cpu(0), [](void* q) { std::free(q); });
}

int local(const TwoLevelParts& p) { return p.lay.local_of[static_cast<size_t>(p.rank)]; }

// Avg in two levels is the average of the nodes' averages: exact only for floats on equal
// nodes (integer averages truncate at each level), so other cases run flat.
bool levels_fit(const TwoLevelParts& p, const CommCall& c) {
  if (p.lay.nodes_n() == p.lay.ranks()) return false;  // one rank per node
  if (c.redop != ReduceOp::Avg) return true;
  return p.lay.uniform && is_floating(c.dtype);
}

// Equal nodes of L ranks: the node's reduce-scatter leaves each rank 1/L of the node's sum,
// the rail all-reduces that share across the nodes, the node's all-gather assembles it; the
// last count % L elements go over the flat world.
bool all_reduce_rail(const TwoLevelParts& p, const CommCall& c, Stream& s) {
  const int64_t L = p.node->size(), per = c.count / L, main = per * L;
  if (per == 0) return false;
  const Tensor mine = part(c.out, per * local(p), per);
  p.node->reduce_scatter(part(c.in, 0, main), mine, c.redop, s);
  p.rail->all_reduce(mine, c.redop, s);
  p.node->all_gather(mine, part(c.out, 0, main), s);
  if (main < c.count) {
    p.flat->all_reduce(part(c.in, main, c.count - main), part(c.out, main, c.count - main), c.redop,
                       s);
  }
  return true;
}

// Unequal nodes: the node all-reduces, the nodes' first ranks all-reduce the node sums between
// the nodes, and each node's first rank broadcasts the result in the node.
bool all_reduce_leaders(const TwoLevelParts& p, const CommCall& c, Stream& s) {
  p.node->all_reduce(c.in, c.out, c.redop, s);
  if (p.leaders) p.leaders->all_reduce(c.out, c.redop, s);
  p.node->broadcast(c.out, 0, s);
  return true;
}

// Moves blocks of `block` elements between global-rank order and rail-major order
// ([local index][node]).
void permute(const TwoLevelParts& p, Stream& s, const Tensor& from, const Tensor& to, int64_t block,
             bool to_rail) {
  std::vector<int64_t> where(p.lay.node_of.size());
  for (size_t g = 0; g < where.size(); ++g)
    where[g] = static_cast<int64_t>(p.lay.local_of[g]) * p.lay.nodes_n() + p.lay.node_of[g];
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
void reduce_scatter_rail(const TwoLevelParts& p, const CommCall& c, Stream& s) {
  const int64_t n = p.lay.ranks(), K = p.lay.nodes_n();
  Tensor staged = scratch(n * c.count, c.dtype), rail = scratch(K * c.count, c.dtype);
  permute(p, s, c.in, staged, c.count, true);
  p.node->reduce_scatter(staged, rail, c.redop, s);
  p.rail->reduce_scatter(rail, c.out, c.redop, s);
}

// The rail gathers the blocks of this rank's index from every node, the node gathers the
// rails, and the blocks are put back in global-rank order.
void all_gather_rail(const TwoLevelParts& p, const CommCall& c, Stream& s) {
  const int64_t n = p.lay.ranks(), K = p.lay.nodes_n();
  Tensor rail = scratch(K * c.count, c.dtype), staged = scratch(n * c.count, c.dtype);
  p.rail->all_gather(c.in, rail, s);
  p.node->all_gather(rail, staged, s);
  permute(p, s, staged, c.out, c.count, false);
}

}  // namespace

NodeLayout node_layout(const std::vector<std::string>& ids) {
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

bool two_level_issue(const TwoLevelParts& p, const CommCall& c, Stream& s) {
  if (!levels_fit(p, c)) return false;
  switch (c.op) {
    case CommOp::AllReduce:
      return p.lay.uniform ? all_reduce_rail(p, c, s) : all_reduce_leaders(p, c, s);
    case CommOp::ReduceScatter:
      if (!p.lay.uniform || c.count == 0) return false;
      reduce_scatter_rail(p, c, s);
      return true;
    case CommOp::AllGather:
      if (!p.lay.uniform || c.count == 0) return false;
      all_gather_rail(p, c, s);
      return true;
    default:
      return false;
  }
}

}  // namespace meshrt::detail
