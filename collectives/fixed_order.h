// Fixed-order reduction: a sum over "leaves" (e.g. one training sequence each) whose rounding does
// not depend on how the leaves are spread over ranks, nor on the number of ranks.
//
// The sum is one fixed binary tree over the global leaf index 0..leaves-1: node (level l, index
// i) covers leaves [i 2^l, (i + 1) 2^l) (cut at `leaves`); a node is its left child plus its right
// child, or its left child alone when the right one holds no leaf. Every f32 addition of the sum
// is one node's, so the result depends only on the leaves' values and their count.
//
// A rank holding the leaves [lo, hi) sums them locally into the maximal aligned nodes inside that
// range (FixedOrderStack: a binary counter, at most 2 log2(hi - lo) + 2 nodes; one when the range
// is an aligned power of two, as for power-of-two ranks and batches). The cross-rank completion
// (fixed_order_reduce_scatter) moves every rank's node partials of each chunk to the chunk's owner
// (all_to_all), which continues the same binary counter over all ranks' nodes in leaf order and
// folds what remains: the very additions one rank holding every leaf makes. An all-gather of the
// chunks completes an all-reduce (fixed_order_all_reduce). Composed of Communicator primitives
// only, so it runs on every backend. Adding tensors is the caller's (FixedOrderOps: collectives/
// does not compute), on the stream passed in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "meshrt/export.h"
#include "runtime/allocator.h"
#include "runtime/tensor.h"

namespace meshrt {

// A node of the tree: leaves [index << level, (index + 1) << level).
struct FixedOrderNode {
  int level = 0;
  int64_t index = 0;
  int64_t first() const { return index << level; }
  bool operator==(const FixedOrderNode&) const = default;
};

// The maximal aligned nodes covering [lo, hi), in leaf order (what a rank holding those leaves
// sends). Throws unless 0 <= lo <= hi.
MESHRT_API std::vector<FixedOrderNode> fixed_order_nodes(int64_t lo, int64_t hi);

// What the reduction computes with: acc += x elementwise (both f32, same shape), one rounding per
// element, enqueued on `stream`; and the allocator of scratch buffers.
struct MESHRT_API FixedOrderOps {
  std::function<void(const Tensor& acc, const Tensor& x, Stream& stream)> add;
  std::shared_ptr<Allocator> allocator;
};

// The binary counter of partial sums over consecutive leaves or aligned nodes, pushed in leaf
// order: a pushed node merges with the top of the stack while the top is its left sibling.
class MESHRT_API FixedOrderStack {
 public:
  explicit FixedOrderStack(FixedOrderOps ops) : ops_(std::move(ops)) {}
  // `value` becomes the stack's (merges add into the left sibling's tensor in place).
  void push(FixedOrderNode node, Tensor value, Stream& stream);
  void push_leaf(int64_t leaf, Tensor value, Stream& stream) { push({0, leaf}, value, stream); }
  const std::vector<std::pair<FixedOrderNode, Tensor>>& nodes() const { return nodes_; }
  // The root of everything pushed, when it covers [0, n) for the tree over n leaves: the nodes
  // left are the binary digits of n, folded from the right (the tree's right spine).
  Tensor fold(Stream& stream);
  void clear() { nodes_.clear(); }

 private:
  FixedOrderOps ops_;
  std::vector<std::pair<FixedOrderNode, Tensor>> nodes_;
};

// Leaves of rank r: [bounds[r], bounds[r + 1]) (bounds: comm.size() + 1 non-decreasing offsets
// from 0). `blocks`: this rank's partial sums, one per node of fixed_order_nodes(bounds[rank],
// bounds[rank + 1]) in that order, each f32 of n elements, n divisible by comm.size(). `out` (n /
// size elements) becomes this rank's chunk [rank n / size, (rank + 1) n / size) of the tree's
// root. Enqueued on `stream`; returns its completion.
MESHRT_API Event fixed_order_reduce_scatter(Communicator& comm, const std::vector<Tensor>& blocks,
                                            const std::vector<int64_t>& bounds, const Tensor& out,
                                            Stream& stream, const FixedOrderOps& ops);
// The same followed by an all-gather: `out` (n elements) is the whole root on every rank.
MESHRT_API Event fixed_order_all_reduce(Communicator& comm, const std::vector<Tensor>& blocks,
                                        const std::vector<int64_t>& bounds, const Tensor& out,
                                        Stream& stream, const FixedOrderOps& ops);

}  // namespace meshrt
