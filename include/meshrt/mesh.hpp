// meshrt's public C++ API: the device mesh (named dims over a communicator's ranks) over the C
// API's meshrt_mesh_t; see meshrt.h. Every failure throws meshrt::Error.
#ifndef MESHRT_MESH_HPP_
#define MESHRT_MESH_HPP_

#include <meshrt/meshrt.h>
#include <meshrt/comm.hpp>

#include <string>

namespace meshrt {
namespace api_v1 {

class Mesh {
 public:
  Mesh() = default;
  // Collective over `comm`: spec "dp=2,tp=2" (row-major, last dim innermost).
  Mesh(const Comm& comm, const std::string& spec) {
    meshrt_mesh_t m = nullptr;
    check(meshrt_mesh_create(&m, comm.get(), spec.c_str()), "meshrt_mesh_create");
    h_ = detail::Handle<meshrt_mesh_t, meshrt_mesh_destroy>(m);
  }
  // The size of `dim` (1 for a dim the mesh lacks) and this rank's coordinate along it.
  int dim_size(const std::string& dim) const {
    int size = 0;
    check(meshrt_mesh_dim(h_.get(), dim.c_str(), &size, nullptr), "meshrt_mesh_dim");
    return size;
  }
  int coord(const std::string& dim) const {
    int c = 0;
    check(meshrt_mesh_dim(h_.get(), dim.c_str(), nullptr, &c), "meshrt_mesh_dim");
    return c;
  }
  // The number of dims (meshrt_mesh_shape).
  int ndim() const {
    int n = 0;
    check(meshrt_mesh_shape(h_.get(), &n, nullptr), "meshrt_mesh_shape");
    return n;
  }
  // The number of ranks: the product of the dims' sizes.
  int world_size() const {
    int w = 0;
    check(meshrt_mesh_shape(h_.get(), nullptr, &w), "meshrt_mesh_shape");
    return w;
  }
  // The communicator along `dim` (the ranks that differ from this one only there), owned by the
  // mesh: a borrowed Comm, on which every collective runs and which never destroys it; valid
  // until the mesh is destroyed. Its default stream is the mesh's.
  Comm comm(const std::string& dim) const {
    meshrt_comm_t c = nullptr;
    check(meshrt_mesh_comm(h_.get(), dim.c_str(), &c), "meshrt_mesh_comm");
    return Comm::borrow(c);
  }
  meshrt_mesh_t get() const noexcept { return h_.get(); }
  // Gives up ownership: the caller destroys the returned handle (meshrt_mesh_destroy).
  meshrt_mesh_t release() noexcept { return h_.release(); }

 private:
  detail::Handle<meshrt_mesh_t, meshrt_mesh_destroy> h_;
};

}  // namespace api_v1
// meshrt::Tensor, meshrt::Comm, ... in user code: api_v1 is a namespace of its own (not
// inline), so a file that also includes the library's internal headers (whose meshrt::Tensor,
// Stream, Event and Error are other types) compiles, and names these meshrt::api_v1::Tensor.
using namespace api_v1;
}  // namespace meshrt

#endif  // MESHRT_MESH_HPP_
