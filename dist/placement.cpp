#include "dist/placement.h"

#include <algorithm>

#include "runtime/error.h"

namespace meshrt {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return op == ReduceOp::Max ? "Partial(max)" : "Partial(sum)";
    case Kind::Shard:
      return "Shard(" + std::to_string(dim) + ")";
  }
  return "?";
}

int64_t shard_size(int64_t n, int parts, int index) {
  return n / parts + (index < n % parts ? 1 : 0);
}

int64_t shard_offset(int64_t n, int parts, int index) {
  return index * (n / parts) + std::min<int64_t>(index, n % parts);
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
    const int c = mesh.coords()[static_cast<size_t>(m)];
    MESHRT_CHECK(l[d] >= md.size, "cannot shard dim " << d << " of size " << l[d] << " (full "
                                                      << full.str() << ") over mesh dim " << md.name
                                                      << "=" << md.size << ": not divisible into "
                                                      << md.size << " non-empty shards");
    off[d] += shard_offset(l[d], md.size, c);
    l[d] = shard_size(l[d], md.size, c);
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
    if (pl[static_cast<size_t>(m)].is_partial() && mesh.coords()[static_cast<size_t>(m)] != 0) {
      out.zero_(stream);
      break;
    }
  return out;
}

namespace {

// Every rank's length of a shard over `g` (an all-gather of one integer: shard lengths are not
// derivable from the local one when the split is uneven).
std::vector<int64_t> gather_lengths(Context& ctx, Communicator& g, int64_t len, Stream& stream) {
  Tensor h = Tensor::from_host_data(&len, {1}, DType::i64);  // owned by the queued copy
  Tensor d = ctx.empty({1}, DType::i64);
  d.copy_(h, stream);
  Tensor all = ctx.empty({g.size()}, DType::i64);
  stream.wait(g.all_gather(d, all, stream));
  Tensor ah = all.to(ctx.host_allocator(), stream);
  stream.synchronize();
  const int64_t* p = ah.data<int64_t>();
  return std::vector<int64_t>(p, p + g.size());
}

}  // namespace

Tensor full_tensor(const Tensor& local, const DeviceMesh& mesh, const std::vector<Placement>& pl,
                   Stream& stream) {
  MESHRT_CHECK(static_cast<int>(pl.size()) == mesh.ndim(),
               "full_tensor: " << pl.size() << " placements for a " << mesh.ndim() << "-d mesh");
  Context& ctx = mesh.ctx();
  Tensor cur = local.contiguous(stream);
  for (int m = mesh.ndim() - 1; m >= 0; --m) {
    const Placement& p = pl[static_cast<size_t>(m)];
    const MeshDim& md = mesh.dims()[static_cast<size_t>(m)];
    Communicator& g = mesh.group(md.name);
    if (p.is_partial()) {
      Tensor out = ctx.empty(cur.shape(), cur.dtype());
      stream.wait(g.all_reduce(cur, out, p.op, stream));
      cur = out;
    } else if (p.is_shard() && md.size > 1) {
      const int d = cur.shape().wrap_dim(p.dim);
      const std::vector<int64_t> lens = gather_lengths(ctx, g, cur.size(d), stream);
      const int64_t longest = *std::max_element(lens.begin(), lens.end());
      int64_t total = 0;
      for (int64_t n : lens) total += n;
      // Every rank sends a block of the longest shard's shape (the tail unused when shorter).
      Shape ps = cur.shape();
      ps[d] = longest;
      Tensor padded = cur;
      if (longest != cur.size(d)) {
        padded = ctx.zeros(ps, cur.dtype());
        padded.narrow(d, 0, cur.size(d)).copy_(cur, stream);
      }
      const int64_t block = padded.numel();
      Tensor gathered = ctx.empty({md.size * block}, cur.dtype());
      stream.wait(g.all_gather(padded.view({block}), gathered, stream));
      Shape fs = cur.shape();
      fs[d] = total;
      Tensor out = ctx.empty(fs, cur.dtype());
      int64_t at = 0;
      for (int j = 0; j < md.size; ++j) {
        const int64_t n = lens[static_cast<size_t>(j)];
        Tensor piece = gathered.narrow(0, j * block, block).view(ps).narrow(d, 0, n);
        out.narrow(d, at, n).copy_(piece, stream);
        at += n;
      }
      cur = out;
    }
  }
  return cur;
}

}  // namespace meshrt
