#include "mesh/placement.h"

#include "runtime/error.h"

namespace meshrt {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return "Partial(sum)";
    case Kind::Shard:
      return "Shard(" + std::to_string(dim) + ")";
  }
  return "?";
}

void shard_extent(const Shape& full, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                  Shape* local, Shape* offsets) {
  MESHRT_CHECK(
      static_cast<int>(pl.size()) == mesh.ndim(),
      "placements: " << pl.size() << " given for a " << mesh.ndim() << "-d mesh " << mesh.str());
  Shape l = full, off = full;
  for (int i = 0; i < off.ndim(); ++i) off[i] = 0;
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = pl[static_cast<size_t>(m)];
    if (!p.is_shard()) continue;
    int d = full.wrap_dim(p.dim);
    const MeshDim& md = mesh.dims()[static_cast<size_t>(m)];
    MESHRT_CHECK(l[d] % md.size == 0, "cannot shard dim " << d << " of size " << l[d] << " (full "
                                                          << full.str() << ") over mesh dim "
                                                          << md.name << "=" << md.size
                                                          << ": not divisible");
    l[d] /= md.size;
    off[d] += mesh.coords()[static_cast<size_t>(m)] * l[d];
  }
  if (local) *local = l;
  if (offsets) *offsets = off;
}

Tensor distribute(const Tensor& full, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                  Stream& stream) {
  Shape l, off;
  shard_extent(full.shape(), mesh, pl, &l, &off);
  Tensor v = full;
  for (int d = 0; d < l.ndim(); ++d) v = v.narrow(d, off[d], l[d]);
  Tensor out = mesh.ctx().empty(l, full.dtype());
  out.copy_(v, stream);
  for (int m = 0; m < mesh.ndim(); ++m)
    if (pl[static_cast<size_t>(m)].kind == Placement::Kind::Partial &&
        mesh.coords()[static_cast<size_t>(m)] != 0) {
      out.zero_(stream);
      break;
    }
  return out;
}

Tensor full_tensor(const Tensor& local, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                   Stream& stream) {
  MESHRT_CHECK(static_cast<int>(pl.size()) == mesh.ndim(),
               "full_tensor: " << pl.size() << " placements for a " << mesh.ndim() << "-d mesh");
  Tensor cur = local.contiguous(stream);
  for (int m = mesh.ndim() - 1; m >= 0; --m) {
    const Placement& p = pl[static_cast<size_t>(m)];
    const MeshDim& md = mesh.dims()[static_cast<size_t>(m)];
    Communicator& g = mesh.group(md.name);
    if (p.kind == Placement::Kind::Partial) {
      Tensor out = mesh.ctx().empty(cur.shape(), cur.dtype());
      stream.wait(g.all_reduce(cur, out, ReduceOp::Sum, stream));
      cur = out;
    } else if (p.is_shard() && md.size > 1) {
      int d = cur.shape().wrap_dim(p.dim);
      Shape gs = cur.shape();
      Tensor gathered = mesh.ctx().empty({md.size * cur.numel()}, cur.dtype());
      stream.wait(g.all_gather(cur.view({cur.numel()}), gathered, stream));
      Shape fs = cur.shape();
      fs[d] *= md.size;
      Tensor out = mesh.ctx().empty(fs, cur.dtype());
      for (int j = 0; j < md.size; ++j) {
        Tensor block = gathered.narrow(0, j * cur.numel(), cur.numel()).view(gs);
        out.narrow(d, j * gs[d], gs[d]).copy_(block, stream);
      }
      cur = out;
    }
  }
  return cur;
}

}  // namespace meshrt
