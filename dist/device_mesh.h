// DeviceMesh: an n-D grid of ranks with named dims, one communicator and comm stream per dim.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "meshrt/export.h"
#include "runtime/context.h"

namespace meshrt {

// The mesh dims meshrt's layers use, named once: tensor parallel (the innermost dim, so a tp group
// is consecutive ranks), data parallel and context parallel (the sequence sharded through the
// whole block, dist/context_parallel.h).
inline constexpr std::string_view kTpDim = "tp";
inline constexpr std::string_view kDpDim = "dp";
inline constexpr std::string_view kCpDim = "cp";
// dp and cp flattened into one group (a mesh with a cp dim has it; without one it is dp): the cp
// ranks hold different tokens of the same sequences, so gradients reduce over dp x cp and ZeRO
// shards over it (dist/data_parallel.h). Not a dim of the spec: size(), coord(), group() and
// stream() take its name.
inline constexpr std::string_view kDpCpDim = "dp_cp";

struct MESHRT_API MeshDim {
  std::string name;
  int size = 1;
};

// Parses "dp=2,tp=4" (names [a-z_][a-z0-9_]*, sizes >= 1, no repeats). When world_size > 0 the
// product must equal it; errors say both numbers and what to change.
MESHRT_API std::vector<MeshDim> parse_mesh_spec(std::string_view spec, int world_size = 0);

class MESHRT_API DeviceMesh {
 public:
  // Collective over `world`: every rank constructs its mesh with the same spec, in the same order
  // relative to other collectives. Rank <-> coordinates are row-major with the last dim
  // innermost, so a tp group (last dim) is a run of consecutive ranks. One communicator per dim is
  // created by split (eagerly, so construction is the only collective step).
  DeviceMesh(Context& ctx, Communicator& world, const std::vector<MeshDim>& dims);
  DeviceMesh(Context& ctx, Communicator& world, std::string_view spec);
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  Context& ctx() const { return ctx_; }
  Communicator& world() const { return world_; }
  int rank() const { return world_.rank(); }
  int world_size() const { return world_.size(); }
  int ndim() const { return static_cast<int>(dims_.size()); }
  const std::vector<MeshDim>& dims() const { return dims_; }
  bool has_dim(std::string_view name) const;
  // The group gradients reduce over: kDpCpDim when the mesh has a cp dim, else kDpDim.
  std::string_view grad_dim() const { return has_dim(kCpDim) ? kDpCpDim : kDpDim; }
  // Index of a named dim; throws listing the mesh's dims.
  int dim_index(std::string_view name) const;
  // Size of a named dim; 1 when the mesh has no such dim (a dp-only mesh has tp size 1).
  int size(std::string_view name) const;
  // This rank's coordinate along a named dim; 0 when the mesh has no such dim.
  int coord(std::string_view name) const;
  const std::vector<int>& coords() const { return coords_; }
  // Global rank of the given coordinates.
  int rank_of(const std::vector<int>& coords) const;
  // The communicator over `name` (ranks that differ only along it). Throws for unknown names.
  Communicator& group(std::string_view name) const;
  // The communication stream of a dim ("comm.<name>" on the context).
  Stream& stream(std::string_view name) const;
  std::string str() const;  // "dp=2,tp=4"

 private:
  Context& ctx_;
  Communicator& world_;
  std::vector<MeshDim> dims_;
  std::vector<int> coords_;
  std::vector<std::unique_ptr<Communicator>> groups_;
  // kDpCpDim's group (meshes with a cp dim), its size and this rank's coordinate in it.
  std::unique_ptr<Communicator> dp_cp_;
  int dp_cp_size_ = 1, dp_cp_coord_ = 0;
};

}  // namespace meshrt
