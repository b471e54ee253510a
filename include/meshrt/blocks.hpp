// meshrt's public C++ API: the sharded MLP and attention blocks over the C API's meshrt_mlp_t /
// meshrt_attn_t (their maths, layouts and sharding are documented in meshrt.h). Every failure
// throws meshrt::Error.
#ifndef MESHRT_BLOCKS_HPP_
#define MESHRT_BLOCKS_HPP_

#include <meshrt/meshrt.h>
#include <meshrt/comm.hpp>
#include <meshrt/mesh.hpp>
#include <meshrt/tensor.hpp>

#include <cstdint>
#include <utility>

namespace meshrt {
namespace api_v1 {

// A parameter's shard: elements [offset, offset + size) of the full tensor along its sharded dim.
struct Shard {
  int64_t offset = 0;
  int64_t size = 0;
};

inline meshrt_mlp_config_t mlp_config() {
  meshrt_mlp_config_t c = MESHRT_MLP_CONFIG_INITIALIZER;
  return c;
}
inline meshrt_attn_config_t attn_config() {
  meshrt_attn_config_t c = MESHRT_ATTN_CONFIG_INITIALIZER;
  return c;
}
inline meshrt_mlp_params_t mlp_params() {
  meshrt_mlp_params_t p = MESHRT_MLP_PARAMS_INITIALIZER;
  return p;
}
inline meshrt_attn_params_t attn_params() {
  meshrt_attn_params_t p = MESHRT_ATTN_PARAMS_INITIALIZER;
  return p;
}

namespace detail {

// One block kind's C calls; Block<Ops> is the C++ object.
struct MlpOps {
  // The C calls' names, which an Error's text names.
  static constexpr const char* create_call = "meshrt_mlp_create";
  static constexpr const char* shard_info_call = "meshrt_mlp_shard_info";
  static constexpr const char* bind_call = "meshrt_mlp_bind_weights";
  static constexpr const char* sync_call = "meshrt_mlp_sync_weights";
  static constexpr const char* forward_call = "meshrt_mlp_forward";
  static constexpr const char* backward_call = "meshrt_mlp_backward";
  using Handle = meshrt_mlp_t;
  using Config = meshrt_mlp_config_t;
  using Params = meshrt_mlp_params_t;
  using Which = meshrt_mlp_param_t;
  static constexpr auto create = meshrt_mlp_create;
  static constexpr auto destroy = meshrt_mlp_destroy;
  static constexpr auto shard_info = meshrt_mlp_shard_info;
  static constexpr auto bind = meshrt_mlp_bind_weights;
  static constexpr auto sync = meshrt_mlp_sync_weights;
  static constexpr auto forward = meshrt_mlp_forward;
  static constexpr auto backward = meshrt_mlp_backward;
};
struct AttnOps {
  static constexpr const char* create_call = "meshrt_attn_create";
  static constexpr const char* shard_info_call = "meshrt_attn_shard_info";
  static constexpr const char* bind_call = "meshrt_attn_bind_weights";
  static constexpr const char* sync_call = "meshrt_attn_sync_weights";
  static constexpr const char* forward_call = "meshrt_attn_forward";
  static constexpr const char* backward_call = "meshrt_attn_backward";
  using Handle = meshrt_attn_t;
  using Config = meshrt_attn_config_t;
  using Params = meshrt_attn_params_t;
  using Which = meshrt_attn_param_t;
  static constexpr auto create = meshrt_attn_create;
  static constexpr auto destroy = meshrt_attn_destroy;
  static constexpr auto shard_info = meshrt_attn_shard_info;
  static constexpr auto bind = meshrt_attn_bind_weights;
  static constexpr auto sync = meshrt_attn_sync_weights;
  static constexpr auto forward = meshrt_attn_forward;
  static constexpr auto backward = meshrt_attn_backward;
};

template <class Ops>
class Block {
 public:
  Block() = default;
  // Checks `config` against the mesh and makes the block (not collective).
  Block(const Mesh& mesh, const typename Ops::Config& config) {
    typename Ops::Handle h = nullptr;
    check(Ops::create(&h, mesh.get(), &config), Ops::create_call);
    h_ = Handle<typename Ops::Handle, Ops::destroy>(h);
  }
  Shard shard(typename Ops::Which which) const {
    Shard s;
    check(Ops::shard_info(h_.get(), which, &s.offset, &s.size), Ops::shard_info_call);
    return s;
  }
  // Binds this rank's parameter shards (the handles may be destroyed afterwards).
  void bind_weights(const typename Ops::Params& weights) const {
    check(Ops::bind(h_.get(), &weights), Ops::bind_call);
  }
  Event sync_weights(const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(Ops::sync(h_.get(), stream ? stream->get() : nullptr, &e), Ops::sync_call);
    return Event(e);
  }
  // y = block(x); collective over the tp group.
  Event forward(const Tensor& x, const Tensor& y, const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(Ops::forward(h_.get(), x.get(), y.get(), stream ? stream->get() : nullptr, &e),
          Ops::forward_call);
    return Event(e);
  }
  // dx from dy for the last forward; parameter gradients are added to `grads`.
  Event backward(const Tensor& dy, const Tensor& dx, const typename Ops::Params& grads,
                 const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(Ops::backward(h_.get(), dy.get(), dx.get(), &grads, stream ? stream->get() : nullptr, &e),
          Ops::backward_call);
    return Event(e);
  }
  typename Ops::Handle get() const noexcept { return h_.get(); }
  // Gives up ownership: the caller destroys the returned handle (meshrt_mlp_destroy /
  // meshrt_attn_destroy).
  typename Ops::Handle release() noexcept { return h_.release(); }

 private:
  Handle<typename Ops::Handle, Ops::destroy> h_;
};

}  // namespace detail

// y = x + fc2(gelu(fc1(norm(x)))), tensor parallel over the mesh's tp dim.
using Mlp = detail::Block<detail::MlpOps>;
// y = x + proj(attention(qkv(norm(x)))), tensor parallel over the mesh's tp dim.
using Attention = detail::Block<detail::AttnOps>;

}  // namespace api_v1
// meshrt::Tensor, meshrt::Comm, ... in user code: api_v1 is a namespace of its own (not
// inline), so a file that also includes the library's internal headers (whose meshrt::Tensor,
// Stream, Event and Error are other types) compiles, and names these meshrt::api_v1::Tensor.
using namespace api_v1;
}  // namespace meshrt

#endif  // MESHRT_BLOCKS_HPP_
