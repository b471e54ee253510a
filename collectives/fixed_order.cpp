#include "collectives/fixed_order.h"

#include <algorithm>

#include "runtime/error.h"

namespace meshrt {

std::vector<FixedOrderNode> fixed_order_nodes(int64_t lo, int64_t hi) {
  MESHRT_CHECK(lo >= 0 && hi >= lo,
               "fixed-order reduction: leaf range [" << lo << ", " << hi << ") is not a range");
  std::vector<FixedOrderNode> out;
  for (int64_t pos = lo; pos < hi;) {
    int level = 0;
    // The largest aligned node starting at pos that ends by hi.
    while (level < 62 && (pos & ((int64_t{1} << (level + 1)) - 1)) == 0 &&
           pos + (int64_t{1} << (level + 1)) <= hi)
      ++level;
    out.push_back({level, pos >> level});
    pos += int64_t{1} << level;
  }
  return out;
}

void FixedOrderStack::push(FixedOrderNode node, Tensor value, Stream& stream) {
  while (!nodes_.empty()) {
    auto& [top, acc] = nodes_.back();
    if (top.level != node.level || top.index % 2 != 0 || top.index + 1 != node.index) break;
    ops_.add(acc, value, stream);  // parent = left + right
    node = {node.level + 1, top.index / 2};
    value = acc;
    nodes_.pop_back();
  }
  nodes_.emplace_back(node, std::move(value));
}

Tensor FixedOrderStack::fold(Stream& stream) {
  MESHRT_CHECK(!nodes_.empty(), "fixed-order reduction: nothing to fold (no leaf was pushed)");
  Tensor acc = nodes_.back().second;
  for (size_t i = nodes_.size() - 1; i-- > 0;) {
    ops_.add(nodes_[i].second, acc, stream);
    acc = nodes_[i].second;
  }
  return acc;
}

namespace {
void check_args(Communicator& comm, const std::vector<Tensor>& blocks,
                const std::vector<int64_t>& bounds, int64_t n) {
  const int p = comm.size();
  MESHRT_CHECK(static_cast<int>(bounds.size()) == p + 1 && bounds.front() == 0,
               "fixed-order reduction: " << bounds.size() << " leaf bounds for " << p
                                         << " ranks; pass size() + 1 offsets starting at 0");
  for (int r = 0; r < p; ++r)
    MESHRT_CHECK(bounds[static_cast<size_t>(r)] <= bounds[static_cast<size_t>(r) + 1],
                 "fixed-order reduction: leaf bounds decrease at rank " << r);
  const auto mine = fixed_order_nodes(bounds[static_cast<size_t>(comm.rank())],
                                      bounds[static_cast<size_t>(comm.rank()) + 1]);
  MESHRT_CHECK(mine.size() == blocks.size(), "fixed-order reduction: rank "
                                                 << comm.rank() << " passed " << blocks.size()
                                                 << " partial sums for its " << mine.size()
                                                 << " tree nodes");
  MESHRT_CHECK(n % p == 0, "fixed-order reduction: " << n << " elements do not divide into " << p
                                                     << " chunks; pad to a multiple of the ranks");
  for (const Tensor& b : blocks)
    MESHRT_CHECK(b.numel() == n && b.dtype() == DType::f32,
                 "fixed-order reduction: the partial sums must be f32 of " << n << " elements");
}
}  // namespace

Event fixed_order_reduce_scatter(Communicator& comm, const std::vector<Tensor>& blocks,
                                 const std::vector<int64_t>& bounds, const Tensor& out,
                                 Stream& stream, const FixedOrderOps& ops) {
  const int p = comm.size();
  const int64_t n = out.numel() * p;
  check_args(comm, blocks, bounds, n);
  std::vector<std::vector<FixedOrderNode>> nodes(static_cast<size_t>(p));
  size_t k_max = 1;
  for (int r = 0; r < p; ++r) {
    nodes[static_cast<size_t>(r)] =
        fixed_order_nodes(bounds[static_cast<size_t>(r)], bounds[static_cast<size_t>(r) + 1]);
    k_max = std::max(k_max, nodes[static_cast<size_t>(r)].size());
  }
  FixedOrderStack stack(ops);
  if (p == 1) {
    for (size_t k = 0; k < blocks.size(); ++k) stack.push(nodes[0][k], blocks[k], stream);
    out.copy_(stack.fold(stream), stream);
    return stream.record();
  }
  // Slot (j, k) of the send buffer: chunk j of this rank's node k, for rank j (unused: zeros).
  const int64_t chunk = n / p, K = static_cast<int64_t>(k_max);
  // One node per rank (power-of-two layouts): the node's own buffer is the send buffer.
  const bool direct = K == 1 && blocks.size() == 1 && blocks[0].is_contiguous();
  Tensor send =
      direct ? blocks[0] : Tensor::empty({p * K * chunk}, DType::f32, ops.allocator, &stream);
  Tensor recv = Tensor::empty({p * K * chunk}, DType::f32, ops.allocator, &stream);
  for (int64_t j = 0; j < p && !direct; ++j)
    for (int64_t k = 0; k < K; ++k) {
      Tensor slot = send.narrow(0, (j * K + k) * chunk, chunk);
      if (k < static_cast<int64_t>(blocks.size()))
        slot.copy_(blocks[static_cast<size_t>(k)].narrow(0, j * chunk, chunk), stream);
      else
        slot.zero_(stream);
    }
  comm.all_to_all(send, recv, stream);
  // The owner continues the binary counter over every rank's nodes in leaf order.
  for (int64_t i = 0; i < p; ++i)
    for (size_t k = 0; k < nodes[static_cast<size_t>(i)].size(); ++k)
      stack.push(nodes[static_cast<size_t>(i)][k],
                 recv.narrow(0, (i * K + static_cast<int64_t>(k)) * chunk, chunk), stream);
  out.copy_(stack.fold(stream), stream);
  return stream.record();
}

Event fixed_order_all_reduce(Communicator& comm, const std::vector<Tensor>& blocks,
                             const std::vector<int64_t>& bounds, const Tensor& out, Stream& stream,
                             const FixedOrderOps& ops) {
  const int p = comm.size();
  MESHRT_CHECK(out.numel() % p == 0, "fixed-order reduction: " << out.numel()
                                                               << " elements do not divide into "
                                                               << p << " chunks");
  const int64_t chunk = out.numel() / p;
  Tensor mine = out.narrow(0, comm.rank() * chunk, chunk);
  fixed_order_reduce_scatter(comm, blocks, bounds, mine, stream, ops);
  if (p == 1) return stream.record();
  return comm.all_gather(mine, out, stream);
}

}  // namespace meshrt
