// Placements (PyTorch DTensor semantics): Shard(dim), Replicate, Partial; distribute / gather.
#pragma once

#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "runtime/tensor.h"

namespace meshrt {

struct Placement {
  enum class Kind : uint8_t { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int dim = 0;  // tensor dim for Shard (negative counts from the end)

  static Placement replicate() { return {Kind::Replicate, 0}; }
  static Placement shard(int d) { return {Kind::Shard, d}; }
  static Placement partial() { return {Kind::Partial, 0}; }
  bool is_shard() const { return kind == Kind::Shard; }
  std::string str() const;  // "Shard(1)", "Replicate()", "Partial(sum)"
};

// Local shape and offsets (in the full tensor) of this rank's shard. Placements: one per mesh
// dim, applied in mesh-dim order (outer first). Throws naming the dim and sizes when an extent
// does not divide by the mesh dim's size.
void shard_extent(const Shape& full, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                  Shape* local, Shape* offsets);

// This rank's shard of `full` (every rank passes the same full tensor), as a new contiguous
// tensor. Partial placements keep the value on mesh coordinate 0 and zeros elsewhere.
Tensor distribute(const Tensor& full, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                  Stream& stream);

// Collective: the full tensor rebuilt from every rank's shard (all-gather over sharded dims,
// all-reduce over Partial ones), identical on every rank. For tests, dumps and checkpoints.
Tensor full_tensor(const Tensor& local, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                   Stream& stream);

}  // namespace meshrt
