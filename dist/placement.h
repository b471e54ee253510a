// Placements (PyTorch DTensor semantics): Shard(dim), Replicate, Partial; distribute / gather.
#pragma once

#include <string>
#include <vector>

#include "dist/device_mesh.h"
#include "meshrt/export.h"
#include "runtime/tensor.h"

namespace meshrt {

struct MESHRT_API Placement {
  enum class Kind : uint8_t { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int dim = 0;                  // tensor dim for Shard (negative counts from the end)
  ReduceOp op = ReduceOp::Sum;  // how Partial values combine

  static Placement replicate() { return {Kind::Replicate, 0}; }
  static Placement shard(int d) { return {Kind::Shard, d}; }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, 0, op}; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool operator==(const Placement&) const = default;
  std::string str() const;  // "Shard(1)", "Replicate()", "Partial(sum)"
};

// Uneven shards: `n` split into `parts` contiguous pieces, the first n % parts one longer (so the
// last ranks hold one less when parts does not divide n). Length and start of piece `index`.
MESHRT_API int64_t shard_size(int64_t n, int parts, int index);
MESHRT_API int64_t shard_offset(int64_t n, int parts, int index);

// Local shape and offsets (in the full tensor) of this rank's shard. Placements: one per mesh
// dim, applied in mesh-dim order (outer first), each split by shard_size / shard_offset.
MESHRT_API void shard_extent(const Shape& full, const DeviceMesh& mesh,
                             const std::vector<Placement>& pl, Shape* local, Shape* offsets);

// This rank's shard of `full` (every rank passes the same full tensor), as a new contiguous
// tensor. Partial placements keep the value on mesh coordinate 0 and zeros elsewhere.
MESHRT_API Tensor distribute(const Tensor& full, const DeviceMesh& mesh,
                             const std::vector<Placement>& pl, Stream& stream);

// Collective: the full tensor rebuilt from every rank's shard (all-gather over sharded dims,
// all-reduce over Partial ones), identical on every rank. Uneven shards are padded to the longest
// for the all-gather (their lengths are gathered first). For tests, dumps and checkpoints.
MESHRT_API Tensor full_tensor(const Tensor& local, const DeviceMesh& mesh,
                              const std::vector<Placement>& pl, Stream& stream);

}  // namespace meshrt
