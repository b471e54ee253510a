// Fixed-order all-reduce / reduce-scatter, composed of all_to_all and all_gather: runs on every
// backend for host tensors (collectives/algorithms/).
#pragma once

#include "collectives/algorithms/algorithm.h"

namespace meshrt::detail {

// The sum over ranks in one fixed binary tree over rank index (collectives/fixed_order.h, one leaf
// per rank: (x0 + x1) + x2 for 3 ranks, (x0 + x1) + (x2 + x3) for 4), whatever the message size,
// chunking or backend, so the bits agree across backends and across splits of a message. Sum and
// avg (the sum divided once) of f32, and of bf16 / f16 summed in f32 and rounded once; i32 / i64
// and max / min are exact in any order and keep the backend's own algorithm. Device tensors are
// refused with an error (the additions run on the host).
extern const Algorithm fixed_order_reduction;

}  // namespace meshrt::detail
