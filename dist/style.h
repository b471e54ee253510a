// Parallel styles (PyTorch's ColwiseParallel, RowwiseParallel, SequenceParallel, ...): how a
// module's parameters lie over tp and which activation placements it takes, computes on and gives.
#pragma once

#include <string>

#include "dist/parallel.h"
#include "meshrt/export.h"

namespace meshrt {

// A module redistributes its input from `input` to `compute_input` before its local compute and
// its output from `compute_output` to `output` after it (redistribute(), with the conjugates in
// backward), so the communication of a block follows from the styles it is composed of: adjacent
// modules agree on the placement between them and nothing moves there.
struct MESHRT_API ParallelStyle {
  std::string name;
  Placement input;           // what the caller passes
  Placement compute_input;   // what the local compute reads
  Placement compute_output;  // what the local compute writes
  Placement output;          // what the caller gets
  Placement weight, bias;    // parameter placements (bias: of a linear or norm)
  // Replicated parameters whose local gradient is a partial sum (the module sees only a sequence
  // shard): the gradient is all-reduced (Partial -> Replicate) before it is accumulated.
  bool partial_param_grads = false;

  Redistribution in() const { return {input, compute_input}; }
  Redistribution out() const { return {compute_output, output}; }
};

// `sequence_parallel`: activations between modules are sequence shards (Shard(0)) instead of
// replicated; pass false at tp=1, where there is nothing to shard.
//
// Linear, weight [in, out] sharded on out: Replicate (or gathered Shard(0)) in, Shard(-1) out.
MESHRT_API ParallelStyle colwise_parallel(bool sequence_parallel);
// Linear, weight sharded on in: Shard(-1) in, Partial reduced to Replicate (or reduce-scattered
// to Shard(0)) out; bias replicated, added once.
MESHRT_API ParallelStyle rowwise_parallel(bool sequence_parallel);
// Whether a linear of style `s` runs a GEMM over a sequence all-gather one sequence shard at a
// time, the rank's own shard first while the gather is in flight (Linear::gemm_local_first):
// the forward under async when the input is gathered and the output left as computed (colwise
// under sequence parallel; chunked splits that gather itself instead), and the dgrad under async
// and chunked when dy is gathered (rowwise under sequence parallel). The executor and the
// planner's cost model both ask these.
MESHRT_API bool forward_own_shard_first(const ParallelStyle& s, Overlap ov);
MESHRT_API bool dgrad_own_shard_first(const ParallelStyle& s, Overlap ov);
// Whether a linear's forward under async computes the output rows the other ranks own first and
// exchanges them while its own rows compute, summing after (Linear::gemm_peer_rows_first):
// a reduce-scattered output (rowwise under sequence parallel).
MESHRT_API bool forward_peer_rows_first(const ParallelStyle& s, Overlap ov);
// Norms (and other per-token modules with replicated weights) on sequence shards.
MESHRT_API ParallelStyle sequence_parallel_norm(bool sequence_parallel);
// Embedding, weight [vocab, hidden] sharded on vocab: token ids Replicate in, the Partial lookup
// reduced to Replicate (or reduce-scattered to Shard(0)) out.
MESHRT_API ParallelStyle vocab_parallel_embedding(bool sequence_parallel);
// LM head: colwise over the vocabulary whose logits stay Shard(-1) for the loss-parallel
// cross-entropy (max and sum-exp Partial -> Replicate instead of gathering the logits).
MESHRT_API ParallelStyle loss_parallel_head(bool sequence_parallel);

}  // namespace meshrt
