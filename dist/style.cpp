#include "dist/style.h"

#include "runtime/error.h"

namespace meshrt {

namespace {
// Activations between modules: sequence shards under sequence parallel, else replicated.
Placement between(bool sp) { return sp ? Placement::shard(0) : Placement::replicate(); }
}  // namespace

ParallelStyle colwise_parallel(bool sp) {
  const Placement R = Placement::replicate(), S = Placement::shard(-1);
  return {"ColwiseParallel", between(sp), R, S, S, Placement::shard(1), Placement::shard(0)};
}

ParallelStyle rowwise_parallel(bool sp) {
  const Placement R = Placement::replicate(), S = Placement::shard(-1);
  return {"RowwiseParallel", S, S, Placement::partial(), between(sp), Placement::shard(0), R};
}

bool forward_own_shard_first(const ParallelStyle& s, Overlap ov) {
  return ov == Overlap::Async && s.in().kind() == RedistKind::AllGather && s.out().is_identity();
}

bool forward_peer_rows_first(const ParallelStyle& s, Overlap ov) {
  return ov == Overlap::Async && s.in().is_identity() &&
         s.out().kind() == RedistKind::ReduceScatter;
}

bool dgrad_own_shard_first(const ParallelStyle& s, Overlap ov) {
  return ov != Overlap::None && s.out().grad().kind() == RedistKind::AllGather;
}

ParallelStyle sequence_parallel_norm(bool sp) {
  const Placement R = Placement::replicate(), A = between(sp);
  return {"SequenceParallel", A, A, A, A, R, R, /*partial_param_grads=*/sp};
}

ParallelStyle vocab_parallel_embedding(bool sp) {
  const Placement R = Placement::replicate();
  return {"VocabParallelEmbedding", R, R, Placement::partial(), between(sp),
          Placement::shard(0),      R};
}

ParallelStyle loss_parallel_head(bool sp) {
  ParallelStyle s = colwise_parallel(sp);
  s.name = "LossParallelHead";
  return s;
}

}  // namespace meshrt
