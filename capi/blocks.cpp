// Device meshes and sharded blocks of the C API: a DeviceMesh over a communicator's handle, and the
// MLP and attention blocks (one BlockObj) whose parameters are the engine's tensors (zero copy) or
// copies of them in meshrt's layout (OUT_IN transposes, [Q|K|V] permutations), run on the mesh's
// compute stream ordered after the caller's stream.
#include <array>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>

#include "capi/capi_internal.h"
#include "mesh/block_desc.h"
#include "mesh/blocks.h"
#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "runtime/error.h"

namespace meshrt::capi {

namespace {

struct MeshObj {
  std::shared_ptr<CommObj> parent;  // the world and its context; outlives the mesh
  std::unique_ptr<DeviceMesh> mesh;
  std::mutex mu;
  std::map<std::string, std::pair<void*, void*>> dim_comms;  // dim -> (comm, default stream)
};

constexpr int kParams = 6;  // every block: norm weight / bias, two linears' weight / bias

// How the engine's tensor of a parameter relates to meshrt's (the block's own) layout.
enum class Xform {
  None,           // the same: used in place
  Transpose,      // OUT_IN 2-D weight: [out, in] for meshrt's [in, out]
  QkvBlocked,     // IN_OUT qkv weight, [Q|K|V] columns: [H, 3, hl, d] for meshrt's [H, hl, 3, d]
  QkvBlockedT,    // OUT_IN qkv weight, [Q|K|V] rows: [3, hl, d, H]
  QkvBiasBlocked  // qkv bias, [Q|K|V]: [3, hl, d] for meshrt's [hl, 3, d]
};

// One sharded block of the C API (MLP or attention): the block over the mesh's tp dim and its six
// parameters, each bound to the engine's tensor in place or through a copy in meshrt's layout.
struct BlockObj {
  std::shared_ptr<MeshObj> mesh;  // declared first: destroyed after the block using it
  Kind kind = Kind::Mlp;
  const char* api = "mlp";  // "mlp" / "attn": the C names (meshrt_<api>_...)
  std::array<const char*, kParams> names{};
  BlockConfig cfg;
  TpOptions opt;
  std::unique_ptr<CommScheduler> sched;
  std::unique_ptr<Block> block;
  std::array<Param*, kParams> params{};
  std::array<Xform, kParams> xform{};
  int64_t heads_local = 0, head_dim = 0;
  std::mutex mu;  // one call at a time on a block
  bool bound = false;
  bool forwarded = false;
  Shape x_shape;
  // meshrt-owned value / gradient of each parameter (copied parameters keep using them).
  std::array<Tensor, kParams> own_value, own_grad;
  std::array<Tensor, kParams> engine_value;  // what bind got (copied again by sync)

  Param& param(int i) const { return *params[static_cast<size_t>(i)]; }
  bool used(int i) const {
    if (i == 1) return cfg.norm == NormKind::LayerNorm;
    if (i == 3 || i == 5) return cfg.bias;
    return true;
  }
  bool copied(int i) const { return xform[static_cast<size_t>(i)] != Xform::None; }
  // The shape the engine's tensor has.
  Shape engine_shape(int i) const {
    const Shape s = own_value[static_cast<size_t>(i)].shape();
    const Xform x = xform[static_cast<size_t>(i)];
    return x == Xform::Transpose || x == Xform::QkvBlockedT ? Shape{s[1], s[0]} : s;
  }
  // Copies the engine's value of parameter i into meshrt's layout.
  void copy_in(int i, Stream& cs) const {
    const auto k = static_cast<size_t>(i);
    const Tensor& own = own_value[k];
    const Tensor& e = engine_value[k];
    const int64_t hl = heads_local, d = head_dim, h = cfg.hidden;
    switch (xform[k]) {
      case Xform::None:
        return;
      case Xform::Transpose:
        own.copy_(e.transpose(0, 1), cs);
        return;
      case Xform::QkvBlocked:  // [H, 3, hl, d] -> [H, hl, 3, d]
        own.view({h, hl, 3, d}).copy_(e.view({h, 3, hl, d}).transpose(1, 2), cs);
        return;
      case Xform::QkvBlockedT:  // [3, hl, d, H] -> [H, hl, d, 3] -> [H, hl, 3, d]
        own.view({h, hl, 3, d}).copy_(e.view({3, hl, d, h}).transpose(0, 3).transpose(2, 3), cs);
        return;
      case Xform::QkvBiasBlocked:  // [3, hl, d] -> [hl, 3, d]
        own.view({hl, 3, d}).copy_(e.view({3, hl, d}).transpose(0, 1), cs);
        return;
    }
  }
  // meshrt's gradient of parameter i in the engine's layout (a new contiguous tensor).
  Tensor grad_out(int i, Stream& cs) const {
    const auto k = static_cast<size_t>(i);
    const Tensor& g = own_grad[k];
    const int64_t hl = heads_local, d = head_dim, h = cfg.hidden;
    const Shape es = engine_shape(i);
    switch (xform[k]) {
      case Xform::None:
        return g;
      case Xform::Transpose:
        return g.transpose(0, 1).contiguous(cs);
      case Xform::QkvBlocked:  // [H, hl, 3, d] -> [H, 3, hl, d]
        return g.view({h, hl, 3, d}).transpose(1, 2).contiguous(cs).view(es);
      case Xform::QkvBlockedT:  // [H, hl, 3, d] -> [3, hl, H, d] -> [3, hl, d, H]
        return g.view({h, hl, 3, d}).transpose(0, 2).transpose(2, 3).contiguous(cs).view(es);
      case Xform::QkvBiasBlocked:  // [hl, 3, d] -> [3, hl, d]
        return g.view({hl, 3, d}).transpose(0, 1).contiguous(cs).view(es);
    }
    return g;
  }
  Context& ctx() const { return mesh->mesh->ctx(); }
};

std::shared_ptr<MeshObj> find_mesh(meshrt_mesh_t h) {
  return find_handle<MeshObj>(h, Kind::Mesh, "mesh");
}
std::shared_ptr<BlockObj> find_block(const void* h, Kind kind) {
  return find_handle<BlockObj>(h, kind, kind == Kind::Attn ? "attn" : "mlp");
}

std::string dim_name(const char* dim) {
  CAPI_CHECK(dim != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             "dim is NULL: pass a dim name of the mesh, e.g. \"tp\"");
  return dim;
}

DType block_dtype(DLDataType t) {
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return DType::f16;
  fail(MESHRT_ERROR_INVALID_ARGUMENT,
       "config dtype (code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) +
           ", lanes " + std::to_string(t.lanes) +
           ") is not a block dtype: use float32, bfloat16 or float16");
}

// The tensor `h` names, checked: dtype, device, shape, writable when `write`.
Tensor block_tensor(const BlockObj& m, meshrt_tensor_t h, const char* what, const Shape& shape,
                    bool write) {
  auto t = find_tensor(h, what);
  const Tensor& x = t->tensor;
  const Device d = x.device();
  const Device md = m.mesh->parent->comm->device();
  CAPI_CHECK(d.type == md.type && (d.is_cpu() || d.index == md.index),
             MESHRT_ERROR_INVALID_ARGUMENT,
             what << " " << x.str() << " is on " << d.str() << " but the mesh runs on " << md.str()
                  << ": pass a tensor on the mesh's device");
  CAPI_CHECK(x.dtype() == m.cfg.dtype, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " " << x.str() << " has dtype " << dtype_name(x.dtype())
                  << " but the block's config dtype is " << dtype_name(m.cfg.dtype) << ": pass a "
                  << dtype_name(m.cfg.dtype) << " tensor");
  CAPI_CHECK(x.shape() == shape, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " has shape " << x.shape().str() << " but this rank's one is " << shape.str()
                  << " (mesh " << m.mesh->mesh->str() << ", tp rank " << m.sched->rank()
                  << "): see meshrt_" << m.api << "_shard_info for the slice");
  CAPI_CHECK(!write || !t->read_only, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " " << x.str()
                  << " was handed in read-only (DLPack flag READ_ONLY) but this call writes it: "
                     "pass a writable tensor");
  if (d == md) return x;
  // CPU ranks as threads run on cpu:<rank> while DLPack's kDLCPU has one device: the same memory,
  // seen on the rank's device (keeping the engine's tensor, and its deleter, alive).
  return Tensor::from_blob(x.data_ptr(), x.shape(), x.dtype(), md, [keep = x](void*) {});
}

using Handles = std::array<meshrt_tensor_t, kParams>;

Handles fields(const meshrt_mlp_params_t& p) {
  return {p.norm_weight, p.norm_bias, p.fc1_weight, p.fc1_bias, p.fc2_weight, p.fc2_bias};
}
Handles fields(const meshrt_attn_params_t& p) {
  return {p.norm_weight, p.norm_bias, p.qkv_weight, p.qkv_bias, p.proj_weight, p.proj_bias};
}

// The six handles of a meshrt_mlp_params_t / meshrt_attn_params_t (same shape: size, then the six
// tensors in meshrt_<api>_param_t order), its size checked.
template <class P>
Handles handles_of(const P* p, const char* what, const char* api) {
  CAPI_CHECK(p != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " is NULL: pass a meshrt_" << api << "_params_t");
  CAPI_CHECK(p->size == sizeof(P), MESHRT_ERROR_INVALID_ARGUMENT,
             what << "->size is " << p->size << ", expected sizeof(meshrt_" << api
                  << "_params_t) = " << sizeof(P) << ": initialise it with MESHRT_"
                  << (std::string(api) == "mlp" ? "MLP" : "ATTN") << "_PARAMS_INITIALIZER");
  return fields(*p);
}

// Runs f on the mesh's compute stream after the work `stream` holds now; `stream` then waits for
// it, and *event (when given) completes with it.
template <class F>
void on_stream(BlockObj& m, meshrt_stream_t stream, meshrt_event_t* event, F&& f) {
  std::shared_ptr<StreamObj> keep;
  Stream& user = resolve_stream(*m.mesh->parent, stream, &keep);
  Stream& cs = m.ctx().compute_stream();
  if (&user != &cs) cs.wait(user.record());
  f(cs);
  Event done = cs.record();
  if (&user != &cs) user.wait(done);
  emit_event(done, event);
}

void copy_weights(BlockObj& m, Stream& cs) {
  for (int i = 0; i < kParams; ++i)
    if (m.used(i) && m.copied(i)) m.copy_in(i, cs);
}

// What the MLP and attention configs share (same field names), checked into m.
template <class C>
void read_common(BlockObj& m, const C& c) {
  BlockConfig& b = m.cfg;
  b.hidden = c.hidden;
  b.dtype = block_dtype(c.dtype);
  CAPI_CHECK(c.norm == MESHRT_NORM_LAYERNORM || c.norm == MESHRT_NORM_RMSNORM,
             MESHRT_ERROR_INVALID_ARGUMENT,
             "config norm " << c.norm
                            << " is not a meshrt_norm_kind_t: use MESHRT_NORM_LAYERNORM (0) or "
                               "MESHRT_NORM_RMSNORM (1)");
  b.norm = c.norm == MESHRT_NORM_RMSNORM ? NormKind::RMSNorm : NormKind::LayerNorm;
  CAPI_CHECK(c.eps > 0, MESHRT_ERROR_INVALID_ARGUMENT,
             "config eps " << c.eps << " must be positive (e.g. 1e-5)");
  b.eps = c.eps;
  b.bias = c.bias != 0;
  CAPI_CHECK(c.weight_layout == MESHRT_WEIGHT_LAYOUT_IN_OUT ||
                 c.weight_layout == MESHRT_WEIGHT_LAYOUT_OUT_IN,
             MESHRT_ERROR_INVALID_ARGUMENT,
             "config weight_layout " << c.weight_layout
                                     << " is not a meshrt_weight_layout_t: use "
                                        "MESHRT_WEIGHT_LAYOUT_IN_OUT (0) or "
                                        "MESHRT_WEIGHT_LAYOUT_OUT_IN (1)");
  m.opt.sequence_parallel = c.sequence_parallel != 0;
  m.opt.overlap = Overlap::Async;
}

// The config struct of a create call, size-checked, with defaults after an older caller's fields.
template <class C>
C read_config(const C* config, const C& defaults, const char* api, const char* initializer) {
  CAPI_CHECK(config != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             "config is NULL: pass a meshrt_" << api << "_config_t (" << initializer << ")");
  CAPI_CHECK(config->size >= offsetof(C, hidden) + sizeof(int64_t) && config->size <= sizeof(C),
             MESHRT_ERROR_INVALID_ARGUMENT,
             "config->size is " << config->size << ", expected sizeof(meshrt_" << api
                                << "_config_t) = " << sizeof(C) << ": initialise it with "
                                << initializer);
  C c = defaults;
  std::memcpy(&c, config, config->size);
  return c;
}

// The rest of create, once the kind-specific part made the block: parameters, their copies.
void finish_create(BlockObj& m, bool weights_transposed) {
  for (int i = 0; i < kParams; ++i) {
    const auto k = static_cast<size_t>(i);
    m.own_value[k] = m.param(i).value;
    m.own_grad[k] = m.param(i).grad;
    if (weights_transposed && (i == 2 || i == 4) && m.xform[k] == Xform::None)
      m.xform[k] = Xform::Transpose;
  }
}

void block_destroy(void* h, Kind kind) {
  if (h == nullptr) return;
  auto m = std::static_pointer_cast<BlockObj>(Registry::get().remove(h, kind));
  const char* api = kind == Kind::Attn ? "attn" : "mlp";
  CAPI_CHECK(m != nullptr, MESHRT_ERROR_INVALID_USAGE,
             api << " (" << h << ") is not a live " << api
                 << " handle: it was destroyed already or never created by meshrt");
  std::lock_guard<std::mutex> lk(m->mu);
  m->ctx().compute_stream().synchronize();
}

void block_bind(BlockObj& m, const Handles& w) {
  std::lock_guard<std::mutex> lk(m.mu);
  std::array<Tensor, kParams> got;
  for (int i = 0; i < kParams; ++i) {
    const std::string what = std::string("weights->") + m.names[static_cast<size_t>(i)];
    meshrt_tensor_t h = w[static_cast<size_t>(i)];
    if (!m.used(i)) {
      CAPI_CHECK(h == nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
                 what << " is set but the config has no such parameter (norm "
                      << (m.cfg.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm") << ", bias "
                      << m.cfg.bias << "): pass NULL");
      continue;
    }
    got[static_cast<size_t>(i)] =
        block_tensor(m, h, what.c_str(), m.engine_shape(i), /*write=*/false);
  }
  for (int i = 0; i < kParams; ++i) {
    if (!m.used(i)) continue;
    const auto k = static_cast<size_t>(i);
    m.engine_value[k] = got[k];
    m.param(i).value = m.copied(i) ? m.own_value[k] : got[k];
  }
  copy_weights(m, m.ctx().compute_stream());
  m.bound = true;
}

void block_sync(BlockObj& m, meshrt_stream_t stream, meshrt_event_t* event) {
  std::lock_guard<std::mutex> lk(m.mu);
  CAPI_CHECK(m.bound, MESHRT_ERROR_INVALID_USAGE,
             m.api << " has no weights: call meshrt_" << m.api << "_bind_weights first");
  on_stream(m, stream, event, [&](Stream& cs) { copy_weights(m, cs); });
}

void block_forward(BlockObj& m, meshrt_tensor_t x, meshrt_tensor_t y, meshrt_stream_t stream,
                   meshrt_event_t* event) {
  std::lock_guard<std::mutex> lk(m.mu);
  CAPI_CHECK(m.bound, MESHRT_ERROR_INVALID_USAGE,
             m.api << " has no weights: call meshrt_" << m.api << "_bind_weights before meshrt_"
                   << m.api << "_forward");
  auto xo = find_tensor(x, "x");
  const Shape xs = xo->tensor.shape();
  CAPI_CHECK(xs.ndim() == 3 && xs[2] == m.cfg.hidden, MESHRT_ERROR_INVALID_ARGUMENT,
             "x has shape " << xs.str() << ": the block takes [seq, batch, hidden=" << m.cfg.hidden
                            << "] (sequence-first"
                            << (m.opt.sequence_parallel ? ", this rank's sequence shard" : "")
                            << ")");
  const Tensor xt = block_tensor(m, x, "x", xs, false);
  const Tensor yt = block_tensor(m, y, "y", xs, true);
  CAPI_CHECK(xt.data_ptr() != yt.data_ptr(), MESHRT_ERROR_INVALID_ARGUMENT,
             "y aliases x, which backward reads again: pass another tensor for y");
  // The block's last op (the residual add) writes the caller's y: no output copy.
  on_stream(m, stream, event, [&](Stream&) { m.block->forward_into(xt, yt); });
  m.forwarded = true;
  m.x_shape = xs;
}

void block_backward(BlockObj& m, meshrt_tensor_t dy, meshrt_tensor_t dx, const Handles& g,
                    meshrt_stream_t stream, meshrt_event_t* event) {
  std::lock_guard<std::mutex> lk(m.mu);
  CAPI_CHECK(m.forwarded, MESHRT_ERROR_INVALID_USAGE,
             "meshrt_" << m.api << "_backward without a forward: call meshrt_" << m.api
                       << "_forward first (each forward takes one backward)");
  const Tensor dyt = block_tensor(m, dy, "dy", m.x_shape, false);
  const Tensor dxt = block_tensor(m, dx, "dx", m.x_shape, true);
  std::array<Tensor, kParams> eg;
  for (int i = 0; i < kParams; ++i) {
    const std::string what = std::string("grads->") + m.names[static_cast<size_t>(i)];
    meshrt_tensor_t h = g[static_cast<size_t>(i)];
    if (!m.used(i)) {
      CAPI_CHECK(h == nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
                 what << " is set but the config has no such parameter: pass NULL");
      continue;
    }
    eg[static_cast<size_t>(i)] = block_tensor(m, h, what.c_str(), m.engine_shape(i), true);
  }
  on_stream(m, stream, event, [&](Stream& cs) {
    Context& ctx = m.ctx();
    // Gradients accumulate straight into the engine's tensors, except copied parameters, whose
    // gradient is made in meshrt's memory and added in the engine's layout.
    for (int i = 0; i < kParams; ++i) {
      if (!m.used(i)) continue;
      const auto k = static_cast<size_t>(i);
      if (m.copied(i)) {
        m.own_grad[k].zero_(cs);
        m.param(i).grad = m.own_grad[k];
      } else {
        m.param(i).grad = eg[k];
      }
    }
    Tensor d = m.block->backward(dyt);
    dxt.copy_(d, cs);
    for (int i = 0; i < kParams; ++i) {
      const auto k = static_cast<size_t>(i);
      if (m.used(i) && m.copied(i)) ops::add(ctx, cs, eg[k], m.grad_out(i, cs), eg[k]);
      m.param(i).grad = m.own_grad[k];  // hold no reference to the engine's memory
    }
  });
  m.forwarded = false;
}

// Checks `which` of a shard_info call.
int param_index(int which, const char* api, const char* first, const char* last) {
  CAPI_CHECK(which >= 0 && which < kParams, MESHRT_ERROR_INVALID_ARGUMENT,
             "which " << which << " is not a meshrt_" << api << "_param_t: use " << first
                      << " (0) .. " << last << " (5)");
  return which;
}

}  // namespace

}  // namespace meshrt::capi

using namespace meshrt;
using namespace meshrt::capi;

extern "C" {

// ---- mesh ----

meshrt_status_t meshrt_mesh_create(meshrt_mesh_t* mesh, meshrt_comm_t comm, const char* spec) {
  return guarded(__func__, [&] {
    check_out(mesh, "mesh");
    *mesh = nullptr;
    auto c = find_comm(comm);
    CAPI_CHECK(spec != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "spec is NULL: pass the mesh's dims, e.g. \"dp=2,tp=2\"");
    std::vector<MeshDim> dims;
    try {  // every rank refuses a bad spec before the collective part starts
      dims = parse_mesh_spec(spec, c->comm->size());
    } catch (const Error& e) {
      fail(MESHRT_ERROR_INVALID_ARGUMENT, e.message());
    }
    auto obj = std::make_shared<MeshObj>();
    obj->parent = c;
    obj->mesh = std::make_unique<DeviceMesh>(*c->ctx, *c->comm, dims);
    *mesh = static_cast<meshrt_mesh_t>(Registry::get().add(Kind::Mesh, obj));
  });
}

meshrt_status_t meshrt_mesh_destroy(meshrt_mesh_t mesh) {
  return guarded(__func__, [&] {
    if (mesh == nullptr) return;
    auto m = std::static_pointer_cast<MeshObj>(Registry::get().remove(mesh, Kind::Mesh));
    CAPI_CHECK(m != nullptr, MESHRT_ERROR_INVALID_USAGE,
               "mesh (" << static_cast<void*>(mesh)
                        << ") is not a live mesh handle: it was destroyed already or never "
                           "created by meshrt");
    std::lock_guard<std::mutex> lk(m->mu);
    for (auto& [name, hs] : m->dim_comms) {
      Registry::get().remove(hs.first, Kind::Comm);
      Registry::get().remove(hs.second, Kind::Stream);
    }
    m->dim_comms.clear();
  });
}

meshrt_status_t meshrt_mesh_comm(meshrt_mesh_t mesh, const char* dim, meshrt_comm_t* comm) {
  return guarded(__func__, [&] {
    check_out(comm, "comm");
    *comm = nullptr;
    auto m = find_mesh(mesh);
    const std::string name = dim_name(dim);
    CAPI_CHECK(
        m->mesh->has_dim(name), MESHRT_ERROR_INVALID_ARGUMENT,
        "mesh " << m->mesh->str() << " has no dim '" << name << "': pass one of the spec's names");
    std::lock_guard<std::mutex> lk(m->mu);
    auto it = m->dim_comms.find(name);
    if (it == m->dim_comms.end()) {
      auto obj = std::make_shared<CommObj>();
      obj->ctx = m->parent->ctx;
      obj->transport = m->parent->transport;
      obj->comm = std::shared_ptr<Communicator>(m, &m->mesh->group(name));  // keeps the mesh
      obj->mesh_owned = true;
      auto so = std::make_shared<StreamObj>();
      so->stream = &obj->ctx->compute_stream();
      so->keep = obj->ctx;
      so->is_default = true;
      set_owner(*so, *obj);
      obj->default_stream_handle = Registry::get().add(Kind::Stream, so);
      void* h = Registry::get().add(Kind::Comm, obj);
      it = m->dim_comms.emplace(name, std::make_pair(h, obj->default_stream_handle)).first;
    }
    *comm = static_cast<meshrt_comm_t>(it->second.first);
  });
}

meshrt_status_t meshrt_mesh_shape(meshrt_mesh_t mesh, int* ndim, int* world_size) {
  return guarded(__func__, [&] {
    auto m = find_mesh(mesh);
    if (ndim) *ndim = m->mesh->ndim();
    if (world_size) *world_size = m->mesh->world_size();
  });
}

meshrt_status_t meshrt_mesh_dim(meshrt_mesh_t mesh, const char* dim, int* size, int* coord) {
  return guarded(__func__, [&] {
    auto m = find_mesh(mesh);
    const std::string name = dim_name(dim);
    if (size) *size = m->mesh->size(name);
    if (coord) *coord = m->mesh->coord(name);
  });
}

// ---- MLP block ----

meshrt_status_t meshrt_mlp_create(meshrt_mlp_t* mlp, meshrt_mesh_t mesh,
                                  const meshrt_mlp_config_t* config) {
  return guarded(__func__, [&] {
    check_out(mlp, "mlp");
    *mlp = nullptr;
    auto m = find_mesh(mesh);
    const meshrt_mlp_config_t c =
        read_config(config, meshrt_mlp_config_t MESHRT_MLP_CONFIG_INITIALIZER, "mlp",
                    "MESHRT_MLP_CONFIG_INITIALIZER");
    auto obj = std::make_shared<BlockObj>();
    obj->mesh = m;
    obj->kind = Kind::Mlp;
    obj->api = "mlp";
    obj->names = {"norm_weight", "norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"};
    read_common(*obj, c);
    BlockConfig& b = obj->cfg;
    b.ffn = c.ffn;
    CAPI_CHECK(c.gelu == MESHRT_GELU_TANH || c.gelu == MESHRT_GELU_ERF,
               MESHRT_ERROR_INVALID_ARGUMENT,
               "config gelu " << c.gelu
                              << " is not a meshrt_gelu_kind_t: use MESHRT_GELU_TANH (0) or "
                                 "MESHRT_GELU_ERF (1)");
    b.gelu = c.gelu == MESHRT_GELU_ERF ? ops::GeluKind::Erf : ops::GeluKind::Tanh;
    try {
      validate_block(b, m->mesh->size(kTpDim), obj->opt, 0, /*attention=*/false);
    } catch (const Error& e) {
      fail(MESHRT_ERROR_INVALID_ARGUMENT, e.message());
    }
    obj->sched = std::make_unique<CommScheduler>(*m->mesh, kTpDim, obj->opt.overlap);
    auto block = std::make_unique<MlpBlock>(*m->mesh, *obj->sched, obj->opt, b, "capi.mlp", 0);
    obj->params = {&block->norm.gamma, &block->norm.beta,  &block->fc1.weight,
                   &block->fc1.bias,   &block->fc2.weight, &block->fc2.bias};
    obj->block = std::move(block);
    finish_create(*obj, c.weight_layout == MESHRT_WEIGHT_LAYOUT_OUT_IN);
    *mlp = static_cast<meshrt_mlp_t>(Registry::get().add(Kind::Mlp, obj));
  });
}

meshrt_status_t meshrt_mlp_destroy(meshrt_mlp_t mlp) {
  return guarded(__func__, [&] { block_destroy(mlp, Kind::Mlp); });
}

meshrt_status_t meshrt_mlp_shard_info(meshrt_mlp_t mlp, meshrt_mlp_param_t which, int64_t* offset,
                                      int64_t* size) {
  return guarded(__func__, [&] {
    auto m = find_block(mlp, Kind::Mlp);
    const int i = param_index(static_cast<int>(which), "mlp", "MESHRT_MLP_NORM_WEIGHT",
                              "MESHRT_MLP_FC2_BIAS");
    // The C API's order is the description's (mesh/block_desc.h), which says where each shard
    // lies; also answered for parameters the config does not use.
    const ParamShard sh = piece_param_shard(PieceKind::Mlp, m->cfg.hidden, m->cfg.ffn, i,
                                            m->sched->size(), m->sched->rank());
    if (offset) *offset = sh.offset;
    if (size) *size = sh.size;
  });
}

meshrt_status_t meshrt_mlp_bind_weights(meshrt_mlp_t mlp, const meshrt_mlp_params_t* weights) {
  return guarded(__func__, [&] {
    auto m = find_block(mlp, Kind::Mlp);
    block_bind(*m, handles_of(weights, "weights", "mlp"));
  });
}

meshrt_status_t meshrt_mlp_sync_weights(meshrt_mlp_t mlp, meshrt_stream_t stream,
                                        meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    block_sync(*find_block(mlp, Kind::Mlp), stream, event);
  });
}

meshrt_status_t meshrt_mlp_forward(meshrt_mlp_t mlp, meshrt_tensor_t x, meshrt_tensor_t y,
                                   meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    block_forward(*find_block(mlp, Kind::Mlp), x, y, stream, event);
  });
}

meshrt_status_t meshrt_mlp_backward(meshrt_mlp_t mlp, meshrt_tensor_t dy, meshrt_tensor_t dx,
                                    const meshrt_mlp_params_t* grads, meshrt_stream_t stream,
                                    meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    auto m = find_block(mlp, Kind::Mlp);
    block_backward(*m, dy, dx, handles_of(grads, "grads", "mlp"), stream, event);
  });
}

// ---- attention block ----

meshrt_status_t meshrt_attn_create(meshrt_attn_t* attn, meshrt_mesh_t mesh,
                                   const meshrt_attn_config_t* config) {
  return guarded(__func__, [&] {
    check_out(attn, "attn");
    *attn = nullptr;
    auto m = find_mesh(mesh);
    const meshrt_attn_config_t c =
        read_config(config, meshrt_attn_config_t MESHRT_ATTN_CONFIG_INITIALIZER, "attn",
                    "MESHRT_ATTN_CONFIG_INITIALIZER");
    auto obj = std::make_shared<BlockObj>();
    obj->mesh = m;
    obj->kind = Kind::Attn;
    obj->api = "attn";
    obj->names = {"norm_weight", "norm_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias"};
    read_common(*obj, c);
    BlockConfig& b = obj->cfg;
    b.heads = c.heads;
    b.ffn = c.hidden;  // unused by attention; keeps validate_block's ffn rule quiet
    CAPI_CHECK(c.causal == 0 || c.causal == 1, MESHRT_ERROR_INVALID_ARGUMENT,
               "config causal " << c.causal << " must be 1 (causal) or 0 (every position)");
    b.causal = c.causal == 1;
    CAPI_CHECK(
        c.qkv_layout == MESHRT_QKV_LAYOUT_PER_HEAD || c.qkv_layout == MESHRT_QKV_LAYOUT_BLOCKED,
        MESHRT_ERROR_INVALID_ARGUMENT,
        "config qkv_layout " << c.qkv_layout
                             << " is not a meshrt_qkv_layout_t: use "
                                "MESHRT_QKV_LAYOUT_PER_HEAD (0) or "
                                "MESHRT_QKV_LAYOUT_BLOCKED (1)");
    CAPI_CHECK(c.heads >= 1, MESHRT_ERROR_INVALID_ARGUMENT,
               "config heads " << c.heads << " must be at least 1");
    const int tp = m->mesh->size(kTpDim);
    try {
      validate_block(b, tp, obj->opt, 0, /*attention=*/true);
    } catch (const Error& e) {
      fail(MESHRT_ERROR_INVALID_ARGUMENT, e.message());
    }
    obj->heads_local = b.heads / tp;
    obj->head_dim = b.hidden / b.heads;
    obj->sched = std::make_unique<CommScheduler>(*m->mesh, kTpDim, obj->opt.overlap);
    auto block =
        std::make_unique<AttentionBlock>(*m->mesh, *obj->sched, obj->opt, b, "capi.attn", 0);
    obj->params = {&block->norm.gamma, &block->norm.beta,   &block->qkv.weight,
                   &block->qkv.bias,   &block->proj.weight, &block->proj.bias};
    obj->block = std::move(block);
    const bool oi = c.weight_layout == MESHRT_WEIGHT_LAYOUT_OUT_IN;
    if (c.qkv_layout == MESHRT_QKV_LAYOUT_BLOCKED) {
      obj->xform[MESHRT_ATTN_QKV_WEIGHT] = oi ? Xform::QkvBlockedT : Xform::QkvBlocked;
      obj->xform[MESHRT_ATTN_QKV_BIAS] = Xform::QkvBiasBlocked;
    }
    finish_create(*obj, oi);
    *attn = static_cast<meshrt_attn_t>(Registry::get().add(Kind::Attn, obj));
  });
}

meshrt_status_t meshrt_attn_destroy(meshrt_attn_t attn) {
  return guarded(__func__, [&] { block_destroy(attn, Kind::Attn); });
}

meshrt_status_t meshrt_attn_shard_info(meshrt_attn_t attn, meshrt_attn_param_t which,
                                       int64_t* offset, int64_t* size) {
  return guarded(__func__, [&] {
    auto m = find_block(attn, Kind::Attn);
    const int i = param_index(static_cast<int>(which), "attn", "MESHRT_ATTN_NORM_WEIGHT",
                              "MESHRT_ATTN_PROJ_BIAS");
    // The description's shards (whole heads: tp divides heads, checked at create): qkv features
    // 3 d per head, proj rows d per head, in meshrt's per-head order.
    const ParamShard sh = piece_param_shard(PieceKind::Attention, m->cfg.hidden, m->cfg.ffn, i,
                                            m->sched->size(), m->sched->rank());
    if (offset) *offset = sh.offset;
    if (size) *size = sh.size;
  });
}

meshrt_status_t meshrt_attn_bind_weights(meshrt_attn_t attn, const meshrt_attn_params_t* weights) {
  return guarded(__func__, [&] {
    auto m = find_block(attn, Kind::Attn);
    block_bind(*m, handles_of(weights, "weights", "attn"));
  });
}

meshrt_status_t meshrt_attn_sync_weights(meshrt_attn_t attn, meshrt_stream_t stream,
                                         meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    block_sync(*find_block(attn, Kind::Attn), stream, event);
  });
}

meshrt_status_t meshrt_attn_forward(meshrt_attn_t attn, meshrt_tensor_t x, meshrt_tensor_t y,
                                    meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    block_forward(*find_block(attn, Kind::Attn), x, y, stream, event);
  });
}

meshrt_status_t meshrt_attn_backward(meshrt_attn_t attn, meshrt_tensor_t dy, meshrt_tensor_t dx,
                                     const meshrt_attn_params_t* grads, meshrt_stream_t stream,
                                     meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    auto m = find_block(attn, Kind::Attn);
    block_backward(*m, dy, dx, handles_of(grads, "grads", "attn"), stream, event);
  });
}

}  // extern "C"
