#include "dist/device_mesh.h"

#include <charconv>
#include <climits>
#include <sstream>

#include "runtime/error.h"

namespace meshrt {

namespace {

bool valid_name(std::string_view n) {
  if (n.empty() || !(std::islower(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  for (char c : n)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  return true;
}

// The number of ranks `dims` describe, or -1 when it exceeds INT_MAX (no overflow on any input).
int64_t mesh_ranks(const std::vector<MeshDim>& dims) {
  int64_t prod = 1;
  for (const auto& d : dims) {
    prod *= d.size;  // both factors <= INT_MAX: fits int64
    if (prod > INT_MAX) return -1;
  }
  return prod;
}

std::string ranks_text(int64_t n) { return n < 0 ? "more than 2147483647" : std::to_string(n); }

}  // namespace

std::vector<MeshDim> parse_mesh_spec(std::string_view spec, int world_size) {
  const char* usage = "; write it as name=size pairs, e.g. dp=2,tp=4";
  MESHRT_CHECK(!spec.empty(), "mesh spec is empty" << usage);
  std::vector<MeshDim> dims;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string_view item = spec.substr(pos, comma == spec.npos ? spec.npos : comma - pos);
    size_t eq = item.find('=');
    MESHRT_CHECK(eq != item.npos,
                 "mesh spec '" << spec << "': '" << item << "' has no '='" << usage);
    std::string_view name = item.substr(0, eq), num = item.substr(eq + 1);
    MESHRT_CHECK(valid_name(name), "mesh spec '" << spec << "': dim name '" << name
                                                 << "' must be lower-case letters, digits or _");
    int v = 0;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    MESHRT_CHECK(ec == std::errc() && p == num.data() + num.size() && v >= 1,
                 "mesh spec '" << spec << "': size of '" << name << "' is '" << num
                               << "', not an integer >= 1");
    for (auto& d : dims)
      MESHRT_CHECK(d.name != name, "mesh spec '" << spec << "' names dim '" << name << "' twice");
    dims.push_back({std::string(name), v});
    if (comma == spec.npos) break;
    pos = comma + 1;
  }
  if (world_size > 0) {
    const int64_t prod = mesh_ranks(dims);
    MESHRT_CHECK(prod == world_size, "mesh spec '" << spec << "' has " << ranks_text(prod)
                                                   << " ranks but the world has " << world_size
                                                   << "; make the sizes multiply to "
                                                   << world_size);
  }
  return dims;
}

DeviceMesh::DeviceMesh(Context& ctx, Communicator& world, std::string_view spec)
    : DeviceMesh(ctx, world, parse_mesh_spec(spec, world.size())) {}

DeviceMesh::DeviceMesh(Context& ctx, Communicator& world, const std::vector<MeshDim>& dims)
    : ctx_(ctx), world_(world), dims_(dims) {
  MESHRT_CHECK(!dims_.empty(), "DeviceMesh needs at least one dim");
  for (const auto& d : dims_)
    MESHRT_CHECK(d.size >= 1, "DeviceMesh " << str() << ": dim '" << d.name << "' has size "
                                            << d.size << "; every size must be >= 1");
  const int64_t prod = mesh_ranks(dims_);
  MESHRT_CHECK(prod == world.size(), "DeviceMesh " << str() << " has " << ranks_text(prod)
                                                   << " ranks but the world has " << world.size());
  MESHRT_CHECK(ctx.device() == world.device(), "DeviceMesh: context on " << ctx.device().str()
                                                                         << ", communicator on "
                                                                         << world.device().str());
  coords_.resize(dims_.size());
  int r = world.rank();
  for (int i = ndim() - 1; i >= 0; --i) {
    coords_[static_cast<size_t>(i)] = r % dims_[static_cast<size_t>(i)].size;
    r /= dims_[static_cast<size_t>(i)].size;
  }
  // One split per dim: the colour is the rank with this dim's coordinate zeroed (unique per line
  // along the dim), the key the coordinate along it.
  for (int i = 0; i < ndim(); ++i) {
    std::vector<int> c = coords_;
    c[static_cast<size_t>(i)] = 0;
    int color = rank_of(c);
    groups_.push_back(world.split(color, coords_[static_cast<size_t>(i)],
                                  world.name() + "/" + dims_[static_cast<size_t>(i)].name));
    MESHRT_CHECK(groups_.back() && groups_.back()->size() == dims_[static_cast<size_t>(i)].size,
                 "DeviceMesh: split for dim " << dims_[static_cast<size_t>(i)].name
                                              << " gave a group of the wrong size");
  }
  if (has_dim(kCpDim)) {
    // dp x cp flattened: the colour zeroes both coordinates, the key runs dp-major.
    MESHRT_CHECK(!has_dim(kDpCpDim), "DeviceMesh "
                                         << str() << ": '" << kDpCpDim
                                         << "' names dp and cp flattened; rename the dim");
    std::vector<int> c = coords_;
    c[static_cast<size_t>(dim_index(kCpDim))] = 0;
    if (has_dim(kDpDim)) c[static_cast<size_t>(dim_index(kDpDim))] = 0;
    dp_cp_size_ = size(kDpDim) * size(kCpDim);
    dp_cp_coord_ = coord(kDpDim) * size(kCpDim) + coord(kCpDim);
    dp_cp_ = world.split(rank_of(c), dp_cp_coord_, world.name() + "/" + std::string(kDpCpDim));
    MESHRT_CHECK(dp_cp_ && dp_cp_->size() == dp_cp_size_,
                 "DeviceMesh: split for " << kDpCpDim << " gave a group of the wrong size");
  }
}

DeviceMesh::~DeviceMesh() = default;

bool DeviceMesh::has_dim(std::string_view name) const {
  for (auto& d : dims_)
    if (d.name == name) return true;
  return false;
}

int DeviceMesh::dim_index(std::string_view name) const {
  for (int i = 0; i < ndim(); ++i)
    if (dims_[static_cast<size_t>(i)].name == name) return i;
  MESHRT_FAIL("mesh " << str() << " has no dim '" << name << "'");
}

int DeviceMesh::size(std::string_view name) const {
  if (name == kDpCpDim && !has_dim(name)) return dp_cp_ ? dp_cp_size_ : size(kDpDim);
  return has_dim(name) ? dims_[static_cast<size_t>(dim_index(name))].size : 1;
}

int DeviceMesh::coord(std::string_view name) const {
  if (name == kDpCpDim && !has_dim(name)) return dp_cp_ ? dp_cp_coord_ : coord(kDpDim);
  return has_dim(name) ? coords_[static_cast<size_t>(dim_index(name))] : 0;
}

int DeviceMesh::rank_of(const std::vector<int>& coords) const {
  MESHRT_CHECK(coords.size() == dims_.size(),
               "rank_of: " << coords.size() << " coordinates for a " << ndim() << "-d mesh");
  int r = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    MESHRT_CHECK(coords[i] >= 0 && coords[i] < dims_[i].size,
                 "rank_of: coordinate " << coords[i] << " out of range for dim " << dims_[i].name
                                        << "=" << dims_[i].size);
    r = r * dims_[i].size + coords[i];
  }
  return r;
}

Communicator& DeviceMesh::group(std::string_view name) const {
  if (name == kDpCpDim && !has_dim(name)) return dp_cp_ ? *dp_cp_ : group(kDpDim);
  return *groups_[static_cast<size_t>(dim_index(name))];
}

Stream& DeviceMesh::stream(std::string_view name) const {
  if (name == kDpCpDim && !has_dim(name)) {
    if (!dp_cp_) return stream(kDpDim);
  } else {
    dim_index(name);
  }
  return ctx_.stream("comm." + std::string(name));
}

std::string DeviceMesh::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < dims_.size(); ++i)
    os << (i ? "," : "") << dims_[i].name << "=" << dims_[i].size;
  return os.str();
}

}  // namespace meshrt
