// --deterministic (docs/training.md): one step's forward and backward whose losses and gradients
// do not depend on the layout. The grain is one sequence of the global batch: each of this rank's
// grains runs as a micro-batch of its own (kernel shapes independent of dp and micro-batching),
// its gradients go into GradSync's fixed tree over the global grain index (push_grain), and the
// step's gradients and loss are completed over dp by the fixed-order reduction
// (collectives/fixed_order.h), whatever the dp size, bucket size, overlap, ZeRO stage or backend.
#pragma once

#include <cstdint>
#include <functional>

#include "dist/data_parallel.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace meshrt {

// Writes the samples [first, first + n) of the step's data stream into ids / targets.
using BatchFn = std::function<void(int64_t first, int64_t n, Tensor* ids, Tensor* targets)>;

// The forward and backward of step `step` (0-based) over a global batch of `batch` sequences in
// grains of `grain` sequences (n = batch / grain leaves): dp rank r holds the grains
// [n r / dp, n (r + 1) / dp). Leaves the reduced gradients in
// `sync` (GradSync::reduce_grains) and returns the global batch's mean loss, a [1] f32 tensor
// equal on every rank and layout.
Tensor deterministic_step(Context& ctx, DeviceMesh& mesh, DecoderModel& model, GradSync& sync,
                          int64_t batch, int64_t grain, int step, const BatchFn& make_batch);

// `meshrt train --deterministic`'s grain without --deterministic-grain: the largest grain of at
// most kDeterministicGrainTokens tokens (grain x seq) that every dp of 1 to 4 dividing `batch`
// allows (batch divisible by dp x grain), 1 at least. A function of batch and seq only, never of
// the layout: 2 at the defaults (--batch 8 --seq 64), 1 for --batch 12 (dp 1, 2, 3 and 4).
// Short sequences run in grains of several: one-sequence grains of 64 tokens ran the default
// model 1.5x slower than without the flag (docs/training.md).
constexpr int64_t kDeterministicGrainTokens = 256;
int64_t default_deterministic_grain(int64_t batch, int64_t seq);

// FNV-1a (64-bit) over the bytes of every parameter and every optimizer state tensor, in parameter
// order: this rank's tp shards, whole over dp (ZeRO's shards are gathered and sharded again, so it
// is collective over the mesh then). Two runs of the same tp agree on it iff their bits do.
uint64_t train_state_digest(Context& ctx, const std::vector<Param*>& params, Optimizer& opt);

}  // namespace meshrt
