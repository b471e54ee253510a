// Device meshes and sharded blocks of the C API: a DeviceMesh over a communicator's handle, and the
// MLP and attention blocks (one BlockObj) whose parameters are the engine's tensors (zero copy) or
// copies of them in meshrt's layout (OUT_IN transposes, [Q|K|V] permutations), run on the mesh's
// compute stream ordered after the caller's stream.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>

#include "capi/capi_internal.h"
#include "dist/device_mesh.h"
#include "dist/placement.h"
#include "model/block_desc.h"
#include "model/blocks.h"
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
  // The C config's shape and dtype as the one model description (model/model_spec.h), converted
  // at the boundary and applied to cfg (apply_model_spec) once the kind's fields are read.
  ModelSpec model;
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

DType block_dtype(DLDataType t, const std::string& field) {
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return DType::f16;
  fail(MESHRT_ERROR_INVALID_ARGUMENT,
       field + " (code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) +
           ", lanes " + std::to_string(t.lanes) +
           ") is not a block dtype: use float32 {kDLFloat, 32, 1}, bfloat16 {kDLBfloat, 16, 1} "
           "or float16 {kDLFloat, 16, 1}");
}

// The checks of a block config struct's fields, naming each as the C caller writes it
// ("meshrt_mlp_config.eps").
struct ConfigFields {
  std::string config;  // "meshrt_mlp_config"

  std::string name(const char* field) const { return config + "." + field; }
  // A flag: 0 or 1 (`meaning` says what each does).
  bool flag(const char* field, int v, const char* meaning) const {
    CAPI_CHECK(v == 0 || v == 1, MESHRT_ERROR_INVALID_ARGUMENT,
               name(field) << " is " << v << ": it is a flag, pass " << meaning);
    return v == 1;
  }
  // An enum of `count` values 0 .. count - 1, named by `choices`.
  int choice(const char* field, int v, int count, const char* type, const char* choices) const {
    CAPI_CHECK(v >= 0 && v < count, MESHRT_ERROR_INVALID_ARGUMENT,
               name(field) << " is " << v << ", not a " << type << ": use " << choices);
    return v;
  }
  int64_t positive(const char* field, int64_t v, const char* what) const {
    CAPI_CHECK(v >= 1, MESHRT_ERROR_INVALID_ARGUMENT,
               name(field) << " is " << v << ": " << what << " must be at least 1");
    return v;
  }
  float eps(float v) const {
    CAPI_CHECK(std::isfinite(v) && v > 0 && v <= 1, MESHRT_ERROR_INVALID_ARGUMENT,
               name("eps") << " is " << v
                           << ": the norm epsilon must be a finite number in (0, 1], e.g. 1e-5");
    return v;
  }
  // rows x cols elements of `bytes` each (the largest weight, `what`) must be countable in int64.
  void fits(const char* rows, int64_t r, const char* cols, int64_t c, int64_t bytes,
            const char* what) const {
    int64_t n = 0;
    CAPI_CHECK(!__builtin_mul_overflow(r, c, &n) && !__builtin_mul_overflow(n, bytes, &n),
               MESHRT_ERROR_INVALID_ARGUMENT,
               name(rows) << " " << r << " x " << name(cols) << " " << c << " x " << bytes
                          << " bytes (the " << what
                          << ") overflows a 64-bit byte count: pass the model's real sizes");
  }
};

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
void read_common(BlockObj& m, const C& c, const ConfigFields& f) {
  BlockConfig& b = m.cfg;
  m.model.hidden = f.positive("hidden", c.hidden, "the model width");
  m.model.dtype = block_dtype(c.dtype, f.name("dtype"));
  f.choice("norm", c.norm, 2, "meshrt_norm_kind_t",
           "MESHRT_NORM_LAYERNORM (0) or MESHRT_NORM_RMSNORM (1)");
  b.norm = c.norm == MESHRT_NORM_RMSNORM ? NormKind::RMSNorm : NormKind::LayerNorm;
  b.eps = f.eps(c.eps);
  f.choice("weight_layout", c.weight_layout, 2, "meshrt_weight_layout_t",
           "MESHRT_WEIGHT_LAYOUT_IN_OUT (0) or MESHRT_WEIGHT_LAYOUT_OUT_IN (1)");
  m.opt.sequence_parallel = f.flag("sequence_parallel", c.sequence_parallel,
                                   "1 (activations are sequence shards over tp) or 0 (whole)");
  m.opt.overlap = Overlap::Async;
}

// Where a field of C ends: the sizes an older caller's config may have.
#define CAPI_FIELD_END(C, f) (offsetof(C, f) + sizeof(C::f))

// The config struct of a create call, size-checked, with defaults after an older caller's fields
// (`ends`: where each field ends; a size inside a field would leave it half read).
template <class C, size_t N>
C read_config(const C* config, const C& defaults, const char* api, const char* initializer,
              const std::array<size_t, N>& ends) {
  CAPI_CHECK(config != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             "config is NULL: pass a meshrt_" << api << "_config_t (" << initializer << ")");
  bool at_end = config->size == sizeof(C);
  for (size_t e : ends) at_end = at_end || config->size == e;
  CAPI_CHECK(at_end && config->size >= CAPI_FIELD_END(C, hidden), MESHRT_ERROR_INVALID_ARGUMENT,
             "meshrt_" << api << "_config.size is " << config->size << ", expected sizeof(meshrt_"
                       << api << "_config_t) = " << sizeof(C) << ": initialise it with "
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
  const int cp = m.mesh->mesh->size(kCpDim);
  const int64_t shard = m.opt.sequence_parallel ? xs[0] * m.sched->size() : xs[0];
  CAPI_CHECK(cp == 1 || shard % 2 == 0, MESHRT_ERROR_INVALID_ARGUMENT,
             "x has shape " << xs.str() << ": on mesh " << m.mesh->mesh->str()
                            << " it is this rank's cp shard of " << shard
                            << " tokens (chunks i and 2cp-1-i of the sequence's 2 x cp = " << 2 * cp
                            << " equal chunks), which must be even: the sequence (" << shard * cp
                            << " tokens) must divide by 2 x cp = " << 2 * cp);
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

// ---- agreement on meshrt_mesh_create's arguments ----

constexpr int64_t kMaxSpecBytes = 4096;

// Every rank's copy of `mine` (host memory of the communicator's context), in rank order: one
// all-gather on the communicator's default stream, waited for.
Tensor gather_to_host(const CommObj& c, const Tensor& mine) {
  Context& ctx = *c.ctx;
  Stream& cs = ctx.compute_stream();
  const int64_t total = mine.numel() * c.comm->size();
  const bool cpu = ctx.device().is_cpu();
  const Tensor in = cpu ? mine : mine.to(ctx.allocator_ptr(), cs);
  const Tensor all = cpu ? Tensor::empty({total}, mine.dtype(), ctx.host_allocator())
                         : ctx.empty({total}, mine.dtype());
  c.comm->all_gather(in, all, cs).synchronize();
  Tensor out = cpu ? all : all.to(ctx.host_allocator(), cs);
  cs.synchronize();
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

// "ranks 0, 2 passed 'dp=2,tp=2'; rank 1 passed 'tp=4'" (specs in order of first appearance).
std::string specs_by_rank(const std::vector<std::string>& specs) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < specs.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == specs[r]; });
    if (it == groups.end()) it = groups.insert(groups.end(), {specs[r], {}});
    it->second.push_back(static_cast<int>(r));
  }
  std::ostringstream os;
  for (size_t i = 0; i < groups.size(); ++i)
    os << (i ? "; " : "") << rank_list(groups[i].second) << " passed '" << groups[i].first << "'";
  return os.str();
}

// The collective part of meshrt_mesh_create's checks: ranks passing different specs would split
// the communicator differently and wait for each other until the timeout, so every rank first
// gathers what the others passed (two all-gathers of the same shape on every rank: the lengths,
// then the texts padded to the longest) and all fail at once, with the same message, unless they
// agree. A rank's own NULL argument is its own message; its peers name it.
void agree_on_spec(const CommObj& c, const meshrt_mesh_t* mesh, const char* spec) {
  const int n = c.comm->size();
  const std::string name = c.comm->name();
  Tensor mine = Tensor::empty({2}, DType::i64, c.ctx->host_allocator());
  mine.data<int64_t>()[0] = spec ? static_cast<int64_t>(std::strlen(spec)) : -1;
  mine.data<int64_t>()[1] = mesh == nullptr ? 1 : 0;
  const Tensor lens = gather_to_host(c, mine);
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) {
    const int64_t len = lens.data<int64_t>()[2 * r];
    const bool mesh_null = lens.data<int64_t>()[2 * r + 1] != 0;
    if (r == c.comm->rank()) continue;  // its own NULLs: the usual message below
    CAPI_CHECK(len >= 0 && !mesh_null, MESHRT_ERROR_INVALID_ARGUMENT,
               "rank " << r << " of communicator '" << name << "' passed "
                       << (mesh_null ? "mesh" : "spec")
                       << " NULL to meshrt_mesh_create, so no rank creates the mesh: fix rank " << r
                       << "'s call");
    longest = std::max(longest, len);
  }
  check_out(mesh, "mesh");
  CAPI_CHECK(spec != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             "spec is NULL: pass the mesh's dims, e.g. \"dp=2,tp=2\"");
  longest = std::max(longest, static_cast<int64_t>(std::strlen(spec)));
  for (int r = 0; r < n; ++r) {
    const int64_t len = lens.data<int64_t>()[2 * r];
    CAPI_CHECK(len <= kMaxSpecBytes, MESHRT_ERROR_INVALID_ARGUMENT,
               (r == c.comm->rank() ? "spec" : "rank " + std::to_string(r) + "'s spec")
                   << " has " << len << " bytes: a mesh spec is at most " << kMaxSpecBytes
                   << " bytes (\"name=size\" pairs such as \"dp=2,tp=2\")");
  }
  Tensor text = Tensor::empty({longest}, DType::u8, c.ctx->host_allocator());
  std::memset(text.data<uint8_t>(), 0, static_cast<size_t>(longest));
  std::memcpy(text.data<uint8_t>(), spec, std::strlen(spec));
  const Tensor all = gather_to_host(c, text);
  std::vector<std::string> specs;
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data<uint8_t>() + r * longest);
    specs.emplace_back(p, static_cast<size_t>(lens.data<int64_t>()[2 * r]));
  }
  const bool same =
      std::all_of(specs.begin(), specs.end(), [&](const std::string& v) { return v == specs[0]; });
  CAPI_CHECK(same, MESHRT_ERROR_INVALID_ARGUMENT,
             "the ranks of communicator '" << name << "' passed different mesh specs ("
                                           << specs_by_rank(specs)
                                           << "), so no rank creates the mesh: pass the same "
                                              "spec on every rank");
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
    if (mesh) *mesh = nullptr;
    auto c = find_comm(comm);
    if (c->comm->size() > 1) {
      agree_on_spec(*c, mesh, spec);
    } else {
      check_out(mesh, "mesh");
      CAPI_CHECK(spec != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
                 "spec is NULL: pass the mesh's dims, e.g. \"dp=2,tp=2\"");
    }
    std::vector<MeshDim> dims;
    try {  // the ranks agree on the spec: all refuse a bad one before the splits start
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
    using C = meshrt_mlp_config_t;
    const std::array<size_t, 9> ends{
        CAPI_FIELD_END(C, hidden),       CAPI_FIELD_END(C, ffn),
        CAPI_FIELD_END(C, dtype),        CAPI_FIELD_END(C, norm),
        CAPI_FIELD_END(C, eps),          CAPI_FIELD_END(C, gelu),
        CAPI_FIELD_END(C, bias),         CAPI_FIELD_END(C, sequence_parallel),
        CAPI_FIELD_END(C, weight_layout)};
    const C c = read_config(config, C MESHRT_MLP_CONFIG_INITIALIZER, "mlp",
                            "MESHRT_MLP_CONFIG_INITIALIZER", ends);
    const ConfigFields f{"meshrt_mlp_config"};
    auto obj = std::make_shared<BlockObj>();
    obj->mesh = m;
    obj->kind = Kind::Mlp;
    obj->api = "mlp";
    obj->names = {"norm_weight", "norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"};
    read_common(*obj, c, f);
    BlockConfig& b = obj->cfg;
    obj->model.ffn = f.positive("ffn", c.ffn, "the inner width");
    obj->model.kind = LayerKind::Mlp;
    apply_model_spec(b, obj->model);
    f.fits("hidden", b.hidden, "ffn", b.ffn, static_cast<int64_t>(dtype_size(b.dtype)),
           "fc1 weight");
    f.choice("gelu", c.gelu, 2, "meshrt_gelu_kind_t",
             "MESHRT_GELU_TANH (0) or MESHRT_GELU_ERF (1)");
    b.gelu = c.gelu == MESHRT_GELU_ERF ? ops::GeluKind::Erf : ops::GeluKind::Tanh;
    b.bias = f.flag("bias", c.bias, "1 (fc1 and fc2 have biases) or 0 (none)");
    try {
      validate_block(b, m->mesh->size(kTpDim), obj->opt, 0, /*attention=*/false,
                     BlockFieldNames::for_config_struct(f.config));
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
    // The C API's order is the description's (model/block_desc.h), which says where each shard
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
    using C = meshrt_attn_config_t;
    const std::array<size_t, 11> ends{
        CAPI_FIELD_END(C, hidden),        CAPI_FIELD_END(C, heads),
        CAPI_FIELD_END(C, dtype),         CAPI_FIELD_END(C, norm),
        CAPI_FIELD_END(C, eps),           CAPI_FIELD_END(C, bias),
        CAPI_FIELD_END(C, causal),        CAPI_FIELD_END(C, sequence_parallel),
        CAPI_FIELD_END(C, weight_layout), CAPI_FIELD_END(C, qkv_layout),
        CAPI_FIELD_END(C, cp_comm)};
    const C c = read_config(config, C MESHRT_ATTN_CONFIG_INITIALIZER, "attn",
                            "MESHRT_ATTN_CONFIG_INITIALIZER", ends);
    const ConfigFields f{"meshrt_attn_config"};
    auto obj = std::make_shared<BlockObj>();
    obj->mesh = m;
    obj->kind = Kind::Attn;
    obj->api = "attn";
    obj->names = {"norm_weight", "norm_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias"};
    read_common(*obj, c, f);
    BlockConfig& b = obj->cfg;
    obj->model.heads = f.positive("heads", c.heads, "the number of attention heads");
    obj->model.ffn = c.hidden;  // unused by attention; keeps validate_block's ffn rule quiet
    obj->model.kind = LayerKind::Attention;
    apply_model_spec(b, obj->model);
    f.fits("hidden", b.hidden, "hidden", b.hidden, 3 * static_cast<int64_t>(dtype_size(b.dtype)),
           "qkv weight, 3 x hidden x hidden");
    b.bias = f.flag("bias", c.bias, "1 (qkv and proj have biases) or 0 (none)");
    b.causal = f.flag("causal", c.causal, "1 (causal) or 0 (every position)");
    f.choice("qkv_layout", c.qkv_layout, 2, "meshrt_qkv_layout_t",
             "MESHRT_QKV_LAYOUT_PER_HEAD (0) or MESHRT_QKV_LAYOUT_BLOCKED (1)");
    f.choice("cp_comm", c.cp_comm, 2, "meshrt_cp_comm_t",
             "MESHRT_CP_COMM_RING (0) or MESHRT_CP_COMM_ALLGATHER (1)");
    b.cp_comm = c.cp_comm == MESHRT_CP_COMM_ALLGATHER ? CpComm::AllGather : CpComm::Ring;
    const int tp = m->mesh->size(kTpDim);
    try {
      validate_block(b, tp, obj->opt, 0, /*attention=*/true,
                     BlockFieldNames::for_config_struct(f.config), m->mesh->size(kCpDim));
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
