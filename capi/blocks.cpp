// Device meshes and sharded blocks of the C API: a DeviceMesh over a communicator's handle, and an
// MlpBlock whose parameters are the engine's tensors (IN_OUT, zero copy) or transposed copies of
// them (OUT_IN), run on the mesh's compute stream ordered after the caller's stream.
#include <array>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>

#include "capi/capi_internal.h"
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

constexpr int kParams = 6;
const std::array<const char*, kParams> kParamNames{"norm_weight", "norm_bias",  "fc1_weight",
                                                   "fc1_bias",    "fc2_weight", "fc2_bias"};

struct MlpObj {
  std::shared_ptr<MeshObj> mesh;  // declared first: destroyed after the block using it
  BlockConfig cfg;
  TpOptions opt;
  meshrt_weight_layout_t layout = MESHRT_WEIGHT_LAYOUT_IN_OUT;
  std::unique_ptr<CommScheduler> sched;
  std::unique_ptr<MlpBlock> block;
  std::mutex mu;  // one call at a time on a block
  bool bound = false;
  bool forwarded = false;
  Shape x_shape;
  // meshrt-owned value / gradient of each parameter (OUT_IN weights keep using them).
  std::array<Tensor, kParams> own_value, own_grad;
  std::array<Tensor, kParams> engine_value;  // what bind got (OUT_IN: re-copied by sync)

  Param& param(int i) {
    switch (i) {
      case 0:
        return block->norm.gamma;
      case 1:
        return block->norm.beta;
      case 2:
        return block->fc1.weight;
      case 3:
        return block->fc1.bias;
      case 4:
        return block->fc2.weight;
      default:
        return block->fc2.bias;
    }
  }
  bool used(int i) const {
    if (i == 1) return cfg.norm == NormKind::LayerNorm;
    if (i == 3 || i == 5) return cfg.bias;
    return true;
  }
  // A 2-D weight the engine holds transposed.
  bool transposed(int i) const {
    return layout == MESHRT_WEIGHT_LAYOUT_OUT_IN && (i == 2 || i == 4);
  }
  // The shape the engine's tensor has.
  Shape engine_shape(int i) {
    const Shape s = own_value[static_cast<size_t>(i)].shape();
    return transposed(i) ? Shape{s[1], s[0]} : s;
  }
  Context& ctx() const { return mesh->mesh->ctx(); }
};

std::shared_ptr<MeshObj> find_mesh(meshrt_mesh_t h) {
  return find_handle<MeshObj>(h, Kind::Mesh, "mesh");
}
std::shared_ptr<MlpObj> find_mlp(meshrt_mlp_t h) {
  return find_handle<MlpObj>(h, Kind::Mlp, "mlp");
}

void check_out(const void* out, const char* what) {
  CAPI_CHECK(out != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " is NULL: pass the address of a value to fill in");
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
Tensor block_tensor(const MlpObj& m, meshrt_tensor_t h, const char* what, const Shape& shape,
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
                  << "): see meshrt_mlp_shard_info for the slice");
  CAPI_CHECK(!write || !t->read_only, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " " << x.str()
                  << " was handed in read-only (DLPack flag READ_ONLY) but this call writes it: "
                     "pass a writable tensor");
  if (d == md) return x;
  // CPU ranks as threads run on cpu:<rank> while DLPack's kDLCPU has one device: the same memory,
  // seen on the rank's device (keeping the engine's tensor, and its deleter, alive).
  return Tensor::from_blob(x.data_ptr(), x.shape(), x.dtype(), md, [keep = x](void*) {});
}

meshrt_tensor_t params_at(const meshrt_mlp_params_t& p, int i) {
  const std::array<meshrt_tensor_t, kParams> all{p.norm_weight, p.norm_bias,  p.fc1_weight,
                                                 p.fc1_bias,    p.fc2_weight, p.fc2_bias};
  return all[static_cast<size_t>(i)];
}

const meshrt_mlp_params_t& check_params(const meshrt_mlp_params_t* p, const char* what) {
  CAPI_CHECK(p != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " is NULL: pass a meshrt_mlp_params_t (MESHRT_MLP_PARAMS_INITIALIZER)");
  CAPI_CHECK(p->size == sizeof(meshrt_mlp_params_t), MESHRT_ERROR_INVALID_ARGUMENT,
             what << "->size is " << p->size
                  << ", expected sizeof(meshrt_mlp_params_t) = " << sizeof(meshrt_mlp_params_t)
                  << ": initialise it with MESHRT_MLP_PARAMS_INITIALIZER");
  return *p;
}

// Runs f on the mesh's compute stream after the work `stream` holds now; `stream` then waits for
// it, and *event (when given) completes with it.
template <class F>
void on_stream(MlpObj& m, meshrt_stream_t stream, meshrt_event_t* event, F&& f) {
  std::shared_ptr<StreamObj> keep;
  Stream& user = resolve_stream(*m.mesh->parent, stream, &keep);
  Stream& cs = m.ctx().compute_stream();
  if (&user != &cs) cs.wait(user.record());
  f(cs);
  Event done = cs.record();
  if (&user != &cs) user.wait(done);
  emit_event(done, event);
}

void copy_weights(MlpObj& m, Stream& cs) {
  for (int i : {2, 4})
    if (m.transposed(i)) {
      const auto k = static_cast<size_t>(i);
      m.own_value[k].copy_(m.engine_value[k].transpose(0, 1), cs);
    }
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
    CAPI_CHECK(config != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "config is NULL: pass a meshrt_mlp_config_t (MESHRT_MLP_CONFIG_INITIALIZER)");
    CAPI_CHECK(config->size >= offsetof(meshrt_mlp_config_t, hidden) + sizeof(int64_t) &&
                   config->size <= sizeof(meshrt_mlp_config_t),
               MESHRT_ERROR_INVALID_ARGUMENT,
               "config->size is " << config->size << ", expected sizeof(meshrt_mlp_config_t) = "
                                  << sizeof(meshrt_mlp_config_t)
                                  << ": initialise it with MESHRT_MLP_CONFIG_INITIALIZER");
    meshrt_mlp_config_t c = MESHRT_MLP_CONFIG_INITIALIZER;
    std::memcpy(&c, config, config->size);
    auto obj = std::make_shared<MlpObj>();
    obj->mesh = m;
    BlockConfig& b = obj->cfg;
    b.hidden = c.hidden;
    b.ffn = c.ffn;
    b.dtype = block_dtype(c.dtype);
    CAPI_CHECK(c.norm == MESHRT_NORM_LAYERNORM || c.norm == MESHRT_NORM_RMSNORM,
               MESHRT_ERROR_INVALID_ARGUMENT,
               "config norm " << c.norm
                              << " is not a meshrt_norm_kind_t: use MESHRT_NORM_LAYERNORM (0) or "
                                 "MESHRT_NORM_RMSNORM (1)");
    b.norm = c.norm == MESHRT_NORM_RMSNORM ? NormKind::RMSNorm : NormKind::LayerNorm;
    CAPI_CHECK(c.gelu == MESHRT_GELU_TANH || c.gelu == MESHRT_GELU_ERF,
               MESHRT_ERROR_INVALID_ARGUMENT,
               "config gelu " << c.gelu
                              << " is not a meshrt_gelu_kind_t: use MESHRT_GELU_TANH (0) or "
                                 "MESHRT_GELU_ERF (1)");
    b.gelu = c.gelu == MESHRT_GELU_ERF ? ops::GeluKind::Erf : ops::GeluKind::Tanh;
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
    obj->layout = static_cast<meshrt_weight_layout_t>(c.weight_layout);
    obj->opt.sequence_parallel = c.sequence_parallel != 0;
    obj->opt.overlap = Overlap::Async;
    try {
      validate_block(b, m->mesh->size(kTpDim), obj->opt, 0, /*attention=*/false);
    } catch (const Error& e) {
      fail(MESHRT_ERROR_INVALID_ARGUMENT, e.message());
    }
    obj->sched = std::make_unique<CommScheduler>(*m->mesh, kTpDim, obj->opt.overlap);
    obj->block = std::make_unique<MlpBlock>(*m->mesh, *obj->sched, obj->opt, b, "capi.mlp", 0);
    for (int i = 0; i < kParams; ++i) {
      obj->own_value[static_cast<size_t>(i)] = obj->param(i).value;
      obj->own_grad[static_cast<size_t>(i)] = obj->param(i).grad;
    }
    *mlp = static_cast<meshrt_mlp_t>(Registry::get().add(Kind::Mlp, obj));
  });
}

meshrt_status_t meshrt_mlp_destroy(meshrt_mlp_t mlp) {
  return guarded(__func__, [&] {
    if (mlp == nullptr) return;
    auto m = std::static_pointer_cast<MlpObj>(Registry::get().remove(mlp, Kind::Mlp));
    CAPI_CHECK(m != nullptr, MESHRT_ERROR_INVALID_USAGE,
               "mlp (" << static_cast<void*>(mlp)
                       << ") is not a live mlp handle: it was destroyed already or never created "
                          "by meshrt");
    std::lock_guard<std::mutex> lk(m->mu);
    m->ctx().compute_stream().synchronize();
  });
}

meshrt_status_t meshrt_mlp_shard_info(meshrt_mlp_t mlp, meshrt_mlp_param_t which, int64_t* offset,
                                      int64_t* size) {
  return guarded(__func__, [&] {
    auto m = find_mlp(mlp);
    const int i = static_cast<int>(which);
    CAPI_CHECK(i >= 0 && i < kParams, MESHRT_ERROR_INVALID_ARGUMENT,
               "which " << i
                        << " is not a meshrt_mlp_param_t: use MESHRT_MLP_NORM_WEIGHT (0) .. "
                           "MESHRT_MLP_FC2_BIAS (5)");
    // fc1 weight / bias and fc2 weight split ffn over tp (placement.h's rule, uneven allowed);
    // the rest is replicated. Also answered for parameters the config does not use.
    const bool split =
        i == MESHRT_MLP_FC1_WEIGHT || i == MESHRT_MLP_FC1_BIAS || i == MESHRT_MLP_FC2_WEIGHT;
    const int tp = m->sched->size(), r = m->sched->rank();
    if (offset) *offset = split ? shard_offset(m->cfg.ffn, tp, r) : 0;
    if (size) *size = split ? shard_size(m->cfg.ffn, tp, r) : m->cfg.hidden;
  });
}

meshrt_status_t meshrt_mlp_bind_weights(meshrt_mlp_t mlp, const meshrt_mlp_params_t* weights) {
  return guarded(__func__, [&] {
    auto m = find_mlp(mlp);
    const meshrt_mlp_params_t& w = check_params(weights, "weights");
    std::lock_guard<std::mutex> lk(m->mu);
    std::array<Tensor, kParams> got;
    for (int i = 0; i < kParams; ++i) {
      const std::string what = std::string("weights->") + kParamNames[static_cast<size_t>(i)];
      meshrt_tensor_t h = params_at(w, i);
      if (!m->used(i)) {
        CAPI_CHECK(h == nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
                   what << " is set but the config has no such parameter (norm "
                        << (m->cfg.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm")
                        << ", bias " << m->cfg.bias << "): pass NULL");
        continue;
      }
      got[static_cast<size_t>(i)] =
          block_tensor(*m, h, what.c_str(), m->engine_shape(i), /*write=*/false);
    }
    for (int i = 0; i < kParams; ++i) {
      if (!m->used(i)) continue;
      const auto k = static_cast<size_t>(i);
      m->engine_value[k] = got[k];
      m->param(i).value = m->transposed(i) ? m->own_value[k] : got[k];
    }
    copy_weights(*m, m->ctx().compute_stream());
    m->bound = true;
  });
}

meshrt_status_t meshrt_mlp_sync_weights(meshrt_mlp_t mlp, meshrt_stream_t stream,
                                        meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    auto m = find_mlp(mlp);
    std::lock_guard<std::mutex> lk(m->mu);
    CAPI_CHECK(m->bound, MESHRT_ERROR_INVALID_USAGE,
               "mlp has no weights: call meshrt_mlp_bind_weights first");
    on_stream(*m, stream, event, [&](Stream& cs) { copy_weights(*m, cs); });
  });
}

meshrt_status_t meshrt_mlp_forward(meshrt_mlp_t mlp, meshrt_tensor_t x, meshrt_tensor_t y,
                                   meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    auto m = find_mlp(mlp);
    std::lock_guard<std::mutex> lk(m->mu);
    CAPI_CHECK(m->bound, MESHRT_ERROR_INVALID_USAGE,
               "mlp has no weights: call meshrt_mlp_bind_weights before meshrt_mlp_forward");
    auto xo = find_tensor(x, "x");
    const Shape xs = xo->tensor.shape();
    CAPI_CHECK(
        xs.ndim() == 3 && xs[2] == m->cfg.hidden, MESHRT_ERROR_INVALID_ARGUMENT,
        "x has shape " << xs.str() << ": the block takes [seq, batch, hidden=" << m->cfg.hidden
                       << "] (sequence-first"
                       << (m->opt.sequence_parallel ? ", this rank's sequence shard" : "") << ")");
    const Tensor xt = block_tensor(*m, x, "x", xs, false);
    const Tensor yt = block_tensor(*m, y, "y", xs, true);
    CAPI_CHECK(xt.data_ptr() != yt.data_ptr(), MESHRT_ERROR_INVALID_ARGUMENT,
               "y aliases x, which backward reads again: pass another tensor for y");
    on_stream(*m, stream, event, [&](Stream& cs) {
      Tensor out = m->block->forward(xt);
      yt.copy_(out, cs);
    });
    m->forwarded = true;
    m->x_shape = xs;
  });
}

meshrt_status_t meshrt_mlp_backward(meshrt_mlp_t mlp, meshrt_tensor_t dy, meshrt_tensor_t dx,
                                    const meshrt_mlp_params_t* grads, meshrt_stream_t stream,
                                    meshrt_event_t* event) {
  return guarded(__func__, [&] {
    if (event) *event = nullptr;
    auto m = find_mlp(mlp);
    const meshrt_mlp_params_t& g = check_params(grads, "grads");
    std::lock_guard<std::mutex> lk(m->mu);
    CAPI_CHECK(m->forwarded, MESHRT_ERROR_INVALID_USAGE,
               "meshrt_mlp_backward without a forward: call meshrt_mlp_forward first (each "
               "forward takes one backward)");
    const Tensor dyt = block_tensor(*m, dy, "dy", m->x_shape, false);
    const Tensor dxt = block_tensor(*m, dx, "dx", m->x_shape, true);
    std::array<Tensor, kParams> eg;
    for (int i = 0; i < kParams; ++i) {
      const std::string what = std::string("grads->") + kParamNames[static_cast<size_t>(i)];
      meshrt_tensor_t h = params_at(g, i);
      if (!m->used(i)) {
        CAPI_CHECK(h == nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
                   what << " is set but the config has no such parameter: pass NULL");
        continue;
      }
      eg[static_cast<size_t>(i)] = block_tensor(*m, h, what.c_str(), m->engine_shape(i), true);
    }
    on_stream(*m, stream, event, [&](Stream& cs) {
      Context& ctx = m->ctx();
      // Gradients accumulate straight into the engine's tensors, except transposed weights,
      // whose gradient is made in meshrt's memory and added transposed.
      for (int i = 0; i < kParams; ++i) {
        if (!m->used(i)) continue;
        const auto k = static_cast<size_t>(i);
        if (m->transposed(i)) {
          m->own_grad[k].zero_(cs);
          m->param(i).grad = m->own_grad[k];
        } else {
          m->param(i).grad = eg[k];
        }
      }
      Tensor d = m->block->backward(dyt);
      dxt.copy_(d, cs);
      for (int i = 0; i < kParams; ++i) {
        const auto k = static_cast<size_t>(i);
        if (m->used(i) && m->transposed(i)) {
          Tensor t = m->own_grad[k].transpose(0, 1).contiguous(cs);
          ops::add(ctx, cs, eg[k], t, eg[k]);
        }
        m->param(i).grad = m->own_grad[k];  // hold no reference to the engine's memory
      }
    });
    m->forwarded = false;
  });
}

}  // extern "C"
