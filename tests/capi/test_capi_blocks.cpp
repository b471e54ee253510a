// The mesh and the sharded MLP block of the C API: on 2 and 4 thread ranks, every layout's output,
// input gradient and weight gradients (this rank's shards, in the declared weight layout) equal a
// double-precision loop over the full weights; bound IN_OUT weights are read in place; each bad
// input gets its status and a message naming what to change.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "capi_test_util.h"

using namespace capi_test;

namespace {

// A contiguous f32 CPU tensor the engine owns, with its borrowed meshrt handle.
class F32 {
 public:
  explicit F32(std::vector<int64_t> shape) : shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t e : shape_) n *= e;
    v.assign(static_cast<size_t>(n), 0.f);
    dl_.data = v.data();
    dl_.device.device_type = kDLCPU;
    dl_.ndim = static_cast<int>(shape_.size());
    dl_.dtype = dl_dtype(kDLFloat, 32);
    dl_.shape = shape_.data();
    CAPI_THROW_UNLESS_OK(meshrt_tensor_from_dltensor(&dl_, &h));
  }
  ~F32() { meshrt_tensor_destroy(h); }
  F32(const F32&) = delete;
  F32& operator=(const F32&) = delete;
  std::vector<float> v;
  meshrt_tensor_t h = nullptr;

 private:
  std::vector<int64_t> shape_;
  DLTensor dl_{};
};

struct Shape3 {
  int64_t seq = 8, batch = 2, hidden = 16, ffn = 22;  // ffn 22: uneven over tp = 4 (6, 6, 5, 5)
};

struct Variant {
  bool layernorm = true, bias = true, erf = false;
};

// The six parameter slots of a bind or backward call; null where the config has no such tensor.
meshrt_mlp_params_t mlp_params(meshrt_tensor_t gamma, meshrt_tensor_t beta, meshrt_tensor_t w1,
                               meshrt_tensor_t b1, meshrt_tensor_t w2, meshrt_tensor_t b2) {
  meshrt_mlp_params_t p = MESHRT_MLP_PARAMS_INITIALIZER;
  p.norm_weight = gamma;
  p.norm_bias = beta;
  p.fc1_weight = w1;
  p.fc1_bias = b1;
  p.fc2_weight = w2;
  p.fc2_bias = b2;
  return p;
}

// Full weights ([in, out] as meshrt) and the naive double-precision block.
struct Ref {
  Shape3 d;
  Variant var;
  std::vector<double> gamma, beta, w1, b1, w2, b2;  // w1 [h, f], w2 [f, h]
  Ref(const Shape3& dims, const Variant& v) : d(dims), var(v) {
    const int64_t h = d.hidden, f = d.ffn;
    gamma.resize(static_cast<size_t>(h));
    beta.assign(static_cast<size_t>(h), 0.0);
    w1.resize(static_cast<size_t>(h * f));
    b1.assign(static_cast<size_t>(f), 0.0);
    w2.resize(static_cast<size_t>(f * h));
    b2.assign(static_cast<size_t>(h), 0.0);
    for (int64_t i = 0; i < h; ++i) gamma[static_cast<size_t>(i)] = 1.0 + val(1, i, 0.3);
    for (int64_t i = 0; i < h * f; ++i) w1[static_cast<size_t>(i)] = val(3, i, 0.4);
    for (int64_t i = 0; i < f * h; ++i) w2[static_cast<size_t>(i)] = val(5, i, 0.4);
    if (v.layernorm)
      for (int64_t i = 0; i < h; ++i) beta[static_cast<size_t>(i)] = val(2, i, 0.3);
    if (v.bias) {
      for (int64_t i = 0; i < f; ++i) b1[static_cast<size_t>(i)] = val(4, i, 0.3);
      for (int64_t i = 0; i < h; ++i) b2[static_cast<size_t>(i)] = val(6, i, 0.3);
    }
  }
  double gelu(double x, double* dg) const {
    if (var.erf) {
      const double c = std::erf(x / std::sqrt(2.0));
      *dg = 0.5 * (1 + c) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
      return 0.5 * x * (1 + c);
    }
    const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x);
    const double t = std::tanh(u);
    *dg = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    return 0.5 * x * (1 + t);
  }
  // out = block(x), dx and the gradients (added to g*) for dout, over rows of [seq * batch, h].
  void run(const std::vector<double>& x, const std::vector<double>& dout, std::vector<double>& out,
           std::vector<double>& dx, std::vector<double>& gg, std::vector<double>& gb,
           std::vector<double>& gw1, std::vector<double>& gb1, std::vector<double>& gw2,
           std::vector<double>& gb2) const {
    const int64_t h = d.hidden, f = d.ffn, rows = d.seq * d.batch;
    out.assign(x.size(), 0.0);
    dx.assign(x.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const double* xr = &x[static_cast<size_t>(r * h)];
      const double* dr = &dout[static_cast<size_t>(r * h)];
      std::vector<double> n, ln, h1(static_cast<size_t>(f)), g(static_cast<size_t>(f)),
          dgl(static_cast<size_t>(f));
      const double rstd = norm_row(xr, h, gamma, beta, var.layernorm, 1e-5, n, ln);
      for (int64_t j = 0; j < f; ++j) {
        double s = b1[static_cast<size_t>(j)];
        for (int64_t i = 0; i < h; ++i)
          s += ln[static_cast<size_t>(i)] * w1[static_cast<size_t>(i * f + j)];
        h1[static_cast<size_t>(j)] = s;
        g[static_cast<size_t>(j)] = gelu(s, &dgl[static_cast<size_t>(j)]);
      }
      for (int64_t i = 0; i < h; ++i) {
        double s = b2[static_cast<size_t>(i)];
        for (int64_t j = 0; j < f; ++j)
          s += g[static_cast<size_t>(j)] * w2[static_cast<size_t>(j * h + i)];
        out[static_cast<size_t>(r * h + i)] = xr[i] + s;
      }
      // backward
      std::vector<double> dh1(static_cast<size_t>(f)), dln(static_cast<size_t>(h), 0.0);
      for (int64_t i = 0; i < h; ++i) gb2[static_cast<size_t>(i)] += dr[i];
      for (int64_t j = 0; j < f; ++j) {
        double s = 0;
        for (int64_t i = 0; i < h; ++i) {
          s += dr[i] * w2[static_cast<size_t>(j * h + i)];
          gw2[static_cast<size_t>(j * h + i)] += g[static_cast<size_t>(j)] * dr[i];
        }
        dh1[static_cast<size_t>(j)] = s * dgl[static_cast<size_t>(j)];
        gb1[static_cast<size_t>(j)] += dh1[static_cast<size_t>(j)];
      }
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < f; ++j) {
          dln[static_cast<size_t>(i)] +=
              dh1[static_cast<size_t>(j)] * w1[static_cast<size_t>(i * f + j)];
          gw1[static_cast<size_t>(i * f + j)] +=
              ln[static_cast<size_t>(i)] * dh1[static_cast<size_t>(j)];
        }
      norm_row_backward(dln, n, rstd, gamma, var.layernorm, gg, gb,
                        &dx[static_cast<size_t>(r * h)]);
      for (int64_t i = 0; i < h; ++i) dx[static_cast<size_t>(r * h + i)] += dr[i];
    }
  }
};

// rows [r0, r0 + nr) x cols [c0, c0 + nc) of a [.., ld] matrix, optionally transposed.
std::vector<double> block_of(const std::vector<double>& m, int64_t ld, int64_t r0, int64_t nr,
                             int64_t c0, int64_t nc, bool transpose) {
  std::vector<double> out;
  if (!transpose) {
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < nc; ++c)
        out.push_back(m[static_cast<size_t>((r0 + r) * ld + c0 + c)]);
  } else {
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t r = 0; r < nr; ++r)
        out.push_back(m[static_cast<size_t>((r0 + r) * ld + c0 + c)]);
  }
  return out;
}

meshrt_mlp_config_t mlp_config(const Shape3& d, const Variant& v, bool sp, int layout) {
  meshrt_mlp_config_t c = MESHRT_MLP_CONFIG_INITIALIZER;
  c.hidden = d.hidden;
  c.ffn = d.ffn;
  c.norm = v.layernorm ? MESHRT_NORM_LAYERNORM : MESHRT_NORM_RMSNORM;
  c.gelu = v.erf ? MESHRT_GELU_ERF : MESHRT_GELU_TANH;
  c.bias = v.bias ? 1 : 0;
  c.sequence_parallel = sp ? 1 : 0;
  c.weight_layout = layout;
  return c;
}

// One rank: binds its shards, runs forward + backward twice (gradients accumulate) and compares
// everything with the reference.
void run_rank(meshrt_comm_t comm, const char* spec, const Shape3& d, const Variant& var, bool sp,
              int layout, DLDataType dt = {kDLFloat, 32, 1}, double tol = 1e-4) {
  meshrt_mesh_t mesh = nullptr;
  CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, comm, spec));
  int tp = 0, tr = 0, dpc = 0;
  CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "tp", &tp, &tr));
  CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "dp", nullptr, &dpc));
  meshrt_mlp_config_t cfg = mlp_config(d, var, sp, layout);
  cfg.dtype = dt;
  meshrt_mlp_t mlp = nullptr;
  CAPI_THROW_UNLESS_OK(meshrt_mlp_create(&mlp, mesh, &cfg));
  const bool oi = layout == MESHRT_WEIGHT_LAYOUT_OUT_IN;
  const int64_t h = d.hidden, f = d.ffn;
  int64_t off1 = 0, n1 = 0, off2 = 0, n2 = 0, ob = 0, nb = 0;
  CAPI_THROW_UNLESS_OK(meshrt_mlp_shard_info(mlp, MESHRT_MLP_FC1_WEIGHT, &off1, &n1));
  CAPI_THROW_UNLESS_OK(meshrt_mlp_shard_info(mlp, MESHRT_MLP_FC2_WEIGHT, &off2, &n2));
  CAPI_THROW_UNLESS_OK(meshrt_mlp_shard_info(mlp, MESHRT_MLP_FC1_BIAS, &ob, &nb));
  // placement.h's rule: the first f % tp ranks hold one more.
  const int64_t want_n = f / tp + (tr < f % tp ? 1 : 0);
  const int64_t want_off = tr * (f / tp) + std::min<int64_t>(tr, f % tp);
  RANK_EXPECT(
      n1 == want_n && off1 == want_off && n2 == n1 && off2 == off1 && ob == off1 && nb == n1,
      "shard_info follows shard_size / shard_offset");
  const Ref ref(d, var);
  // This rank's shards in the declared layout.
  Mat gamma({h}, dt), beta({h}, dt),
      w1(oi ? std::vector<int64_t>{n1, h} : std::vector<int64_t>{h, n1}, dt), b1({n1}, dt),
      w2(oi ? std::vector<int64_t>{h, n1} : std::vector<int64_t>{n1, h}, dt), b2({h}, dt);
  gamma.load(ref.gamma);
  beta.load(ref.beta);
  w1.load(block_of(ref.w1, f, 0, h, off1, n1, oi));
  b1.load(block_of(ref.b1, f, 0, 1, off1, n1, false));
  w2.load(block_of(ref.w2, h, off2, n2, 0, h, oi));
  b2.load(ref.b2);
  meshrt_mlp_params_t w = mlp_params(gamma.h, var.layernorm ? beta.h : nullptr, w1.h,
                                     var.bias ? b1.h : nullptr, w2.h, var.bias ? b2.h : nullptr);
  CAPI_THROW_UNLESS_OK(meshrt_mlp_bind_weights(mlp, &w));
  // Activations: each dp replica its own data; under SP this rank's sequence shard.
  const int64_t rows = d.seq * d.batch;
  std::vector<double> x(static_cast<size_t>(rows * h)), dout(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = val(100 + static_cast<uint64_t>(dpc), static_cast<int64_t>(i), 1.5);
    dout[i] = val(200 + static_cast<uint64_t>(dpc), static_cast<int64_t>(i), 1.0);
  }
  const int64_t sl = sp ? d.seq / tp : d.seq, s0 = sp ? tr * sl : 0;
  auto local = [&](const std::vector<double>& v) {
    return std::vector<double>(v.begin() + s0 * d.batch * h, v.begin() + (s0 + sl) * d.batch * h);
  };
  Mat xt({sl, d.batch, h}, dt), yt({sl, d.batch, h}, dt), dyt({sl, d.batch, h}, dt),
      dxt({sl, d.batch, h}, dt);
  xt.load(local(x));
  dyt.load(local(dout));
  Mat ggam({h}, dt), gbeta({h}, dt),
      gw1(oi ? std::vector<int64_t>{n1, h} : std::vector<int64_t>{h, n1}, dt), gb1({n1}, dt),
      gw2(oi ? std::vector<int64_t>{h, n1} : std::vector<int64_t>{n1, h}, dt), gb2({h}, dt);
  meshrt_mlp_params_t g = mlp_params(ggam.h, var.layernorm ? gbeta.h : nullptr, gw1.h,
                                     var.bias ? gb1.h : nullptr, gw2.h, var.bias ? gb2.h : nullptr);
  std::vector<double> out, dx, rg(static_cast<size_t>(h), 0.0), rb(rg), rw1(ref.w1.size(), 0.0),
      rb1(static_cast<size_t>(f), 0.0), rw2(ref.w2.size(), 0.0), rb2(rg);
  ref.run(x, dout, out, dx, rg, rb, rw1, rb1, rw2, rb2);
  const std::string where = std::string(spec) + (sp ? " sp" : "") + (oi ? " OUT_IN" : " IN_OUT") +
                            (var.layernorm ? " layernorm" : " rmsnorm") +
                            (var.bias ? " bias" : " no-bias") + " rank tp" + std::to_string(tr) +
                            " dp" + std::to_string(dpc);
  // OUT_IN runs on a stream of the engine's (the block orders itself after it and the stream
  // waits for the block), IN_OUT on the default stream.
  meshrt_stream_t stream = nullptr;
  if (oi) CAPI_THROW_UNLESS_OK(meshrt_stream_create(comm, &stream));
  for (int step = 1; step <= 2; ++step) {  // gradients add up: the second step doubles them
    meshrt_event_t ev = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_mlp_forward(mlp, xt.h, yt.h, stream, &ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    expect_close(yt.values(), local(out), "y", where, tol);
    CAPI_THROW_UNLESS_OK(meshrt_mlp_backward(mlp, dyt.h, dxt.h, &g, stream, &ev));
    if (stream) {  // the engine's stream is behind the block's work
      CAPI_THROW_UNLESS_OK(meshrt_stream_synchronize(stream));
      int done = 0;
      CAPI_THROW_UNLESS_OK(meshrt_event_query(ev, &done));
      RANK_EXPECT(done == 1, "the caller's stream waits for the block's event");
    }
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    expect_close(dxt.values(), local(dx), "dx", where, tol);
    const double k = step;
    expect_close(ggam.values(), scaled(rg, k), "norm_weight grad", where, tol);
    if (var.layernorm) expect_close(gbeta.values(), scaled(rb, k), "norm_bias grad", where, tol);
    expect_close(gw1.values(), scaled(block_of(rw1, f, 0, h, off1, n1, oi), k), "fc1_weight grad",
                 where, tol);
    expect_close(gw2.values(), scaled(block_of(rw2, h, off2, n2, 0, h, oi), k), "fc2_weight grad",
                 where, tol);
    if (var.bias) {
      expect_close(gb1.values(), scaled(block_of(rb1, f, 0, 1, off1, n1, false), k),
                   "fc1_bias grad", where, tol);
      expect_close(gb2.values(), scaled(rb2, k), "fc2_bias grad", where, tol);
    }
  }
  CAPI_THROW_UNLESS_OK(meshrt_stream_destroy(stream));
  CAPI_THROW_UNLESS_OK(meshrt_mlp_destroy(mlp));
  CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
}

}  // namespace

TEST_CASE("capi: mesh create with dims and coords and dim communicators", "[capi]") {
  World w(4);
  run_ranks(4, [&](int r) {
    meshrt_comm_t comm = w.comms[static_cast<size_t>(r)];
    meshrt_mesh_t mesh = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, comm, "dp=2,tp=2"));
    int ndim = 0, ws = 0, dp = 0, dpc = -1, tp = 0, tpc = -1, pp = 0, ppc = -1;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_shape(mesh, &ndim, &ws));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "dp", &dp, &dpc));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "tp", &tp, &tpc));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "pp", &pp, &ppc));
    RANK_EXPECT(ndim == 2 && ws == 4, "2 dims over 4 ranks");
    RANK_EXPECT(dp == 2 && tp == 2 && dpc == r / 2 && tpc == r % 2, "row-major, tp innermost");
    RANK_EXPECT(pp == 1 && ppc == 0, "a dim the mesh lacks has size 1, coordinate 0");
    meshrt_comm_t tpcomm = nullptr, again = nullptr, dpcomm = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_comm(mesh, "tp", &tpcomm));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_comm(mesh, "tp", &again));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_comm(mesh, "dp", &dpcomm));
    RANK_EXPECT(tpcomm == again, "the mesh hands out one handle per dim");
    int sr = -1, ss = 0;
    CAPI_THROW_UNLESS_OK(meshrt_comm_rank(tpcomm, &sr));
    CAPI_THROW_UNLESS_OK(meshrt_comm_size(tpcomm, &ss));
    RANK_EXPECT(sr == r % 2 && ss == 2, "tp communicator: rank = tp coordinate");
    // A collective over the tp group: sum of world ranks of the pair.
    F32 b({1});
    b.v[0] = static_cast<float>(r);
    meshrt_event_t ev = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_all_reduce(tpcomm, b.h, b.h, MESHRT_SUM, nullptr, &ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    RANK_EXPECT(b.v[0] == (r / 2) * 4 + 1, "tp all-reduce sums the pair");
    CAPI_THROW_UNLESS_OK(meshrt_all_reduce(dpcomm, b.h, b.h, MESHRT_SUM, nullptr, &ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    RANK_EXPECT(b.v[0] == 6, "dp all-reduce of the pair sums: 1 + 5");
    RANK_EXPECT(meshrt_comm_destroy(tpcomm) == MESHRT_ERROR_INVALID_USAGE &&
                    std::string(meshrt_last_error()).find("owned by the mesh") != std::string::npos,
                "the mesh owns its dim communicators");
    CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
    RANK_EXPECT(meshrt_comm_rank(tpcomm, &sr) == MESHRT_ERROR_INVALID_USAGE,
                "dim communicators go with the mesh");
  });
}

TEST_CASE("capi: bad mesh specs are invalid arguments with meshrt's message", "[capi]") {
  World w(1);
  meshrt_mesh_t mesh = nullptr;
  require_status(meshrt_mesh_create(&mesh, w.comms[0], "dp=2,tp=2"), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"4", "1"});
  CHECK(mesh == nullptr);
  require_status(meshrt_mesh_create(&mesh, w.comms[0], "tp=1,tp=1"), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"tp"});
  require_status(meshrt_mesh_create(&mesh, w.comms[0], "Tp=1"), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"Tp"});
  require_status(meshrt_mesh_create(&mesh, w.comms[0], nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"spec is NULL"});
  require_status(meshrt_mesh_create(nullptr, w.comms[0], "tp=1"), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"mesh is NULL"});
  CAPI_REQUIRE_OK(meshrt_mesh_create(&mesh, w.comms[0], "tp=1"));
  meshrt_comm_t c = nullptr;
  require_status(meshrt_mesh_comm(mesh, "dp", &c), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"no dim 'dp'", "tp=1"});
  CAPI_REQUIRE_OK(meshrt_mesh_destroy(mesh));
  int s = 0;
  require_status(meshrt_mesh_dim(mesh, "tp", &s, nullptr), MESHRT_ERROR_INVALID_USAGE,
                 {"not a live mesh"});
  require_status(meshrt_mesh_destroy(mesh), MESHRT_ERROR_INVALID_USAGE, {"destroyed already"});
}

TEST_CASE("capi: sharded MLP equals a double loop over the full weights", "[capi][multirank]") {
  struct Case {
    int n;
    const char* spec;
  };
  for (Case c : {Case{2, "tp=2"}, Case{4, "tp=4"}, Case{4, "dp=2,tp=2"}}) {
    for (bool sp : {false, true}) {
      for (int layout : {MESHRT_WEIGHT_LAYOUT_IN_OUT, MESHRT_WEIGHT_LAYOUT_OUT_IN}) {
        for (Variant v : {Variant{true, true, false}, Variant{false, false, true}}) {
          INFO(c.spec << (sp ? " sp" : "") << " layout " << layout << " layernorm " << v.layernorm);
          World w(c.n);
          run_ranks(c.n, [&](int r) {
            run_rank(w.comms[static_cast<size_t>(r)], c.spec, Shape3{}, v, sp, layout);
          });
        }
      }
    }
  }
}

TEST_CASE("capi: sharded MLP in bf16 and f16 stays within 16-bit rounding of the double loop",
          "[capi][multirank]") {
  // Inputs are rounded to 16 bits and the block rounds activations between its GEMMs; the
  // reference sees unrounded values. 3e-2 of the largest magnitude covers bf16's 8-bit mantissa
  // here; a wrong shard or layout errs by O(1).
  for (DtypeCase dc :
       {DtypeCase{"bf16", dl_dtype(kDLBfloat, 16)}, DtypeCase{"f16", dl_dtype(kDLFloat, 16)}}) {
    INFO(dc.name);
    World w(2);
    run_ranks(2, [&](int r) {
      run_rank(w.comms[static_cast<size_t>(r)], "tp=2", Shape3{}, Variant{}, true,
               MESHRT_WEIGHT_LAYOUT_OUT_IN, dc.dt, 3e-2);
    });
  }
}

TEST_CASE("capi: IN_OUT weights are read in place and OUT_IN ones at bind and sync",
          "[capi][multirank]") {
  const Shape3 d{4, 1, 8, 8};
  const Variant var{true, true, false};
  for (int layout : {MESHRT_WEIGHT_LAYOUT_IN_OUT, MESHRT_WEIGHT_LAYOUT_OUT_IN}) {
    INFO("layout " << layout);
    World w(2);
    run_ranks(2, [&](int r) {
      meshrt_mesh_t mesh = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, w.comms[static_cast<size_t>(r)], "tp=2"));
      const meshrt_mlp_config_t cfg = mlp_config(d, var, false, layout);
      meshrt_mlp_t mlp = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_mlp_create(&mlp, mesh, &cfg));
      const bool oi = layout == MESHRT_WEIGHT_LAYOUT_OUT_IN;
      const std::vector<int64_t> s1 = oi ? std::vector<int64_t>{4, 8} : std::vector<int64_t>{8, 4};
      const std::vector<int64_t> s2{s1[1], s1[0]};
      F32 gamma({8}), beta({8}), w1(s1), b1({4}), w2(s2), b2({8});
      for (float& v : gamma.v) v = 1.f;
      for (size_t i = 0; i < w1.v.size(); ++i)
        w1.v[i] = static_cast<float>(val(7, int64_t(i), 0.5));
      for (size_t i = 0; i < w2.v.size(); ++i)
        w2.v[i] = static_cast<float>(val(8, int64_t(i), 0.5));
      meshrt_mlp_params_t p = mlp_params(gamma.h, beta.h, w1.h, b1.h, w2.h, b2.h);
      CAPI_THROW_UNLESS_OK(meshrt_mlp_bind_weights(mlp, &p));
      F32 x({4, 1, 8}), y1({4, 1, 8}), y2({4, 1, 8}), y3({4, 1, 8});
      for (size_t i = 0; i < x.v.size(); ++i) x.v[i] = static_cast<float>(val(9, int64_t(i), 1.0));
      meshrt_event_t ev = nullptr;
      auto forward = [&](F32& y) {
        CAPI_THROW_UNLESS_OK(meshrt_mlp_forward(mlp, x.h, y.h, nullptr, &ev));
        CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
        CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
      };
      forward(y1);
      // The engine updates its fc2 weight shard in its own memory; no re-bind.
      for (float& v : w2.v) v *= 3.f;
      F32 dy({4, 1, 8}), dx({4, 1, 8});
      F32 gg({8}), gb({8}), gw1(s1), gb1({4}), gw2(s2), gb2({8});
      meshrt_mlp_params_t g = mlp_params(gg.h, gb.h, gw1.h, gb1.h, gw2.h, gb2.h);
      CAPI_THROW_UNLESS_OK(meshrt_mlp_backward(mlp, dy.h, dx.h, &g, nullptr, nullptr));
      forward(y2);
      double diff12 = 0;
      for (size_t i = 0; i < y1.v.size(); ++i)
        diff12 = std::max(diff12, double(std::fabs(y1.v[i] - y2.v[i])));
      if (layout == MESHRT_WEIGHT_LAYOUT_IN_OUT) {
        RANK_EXPECT(diff12 > 1e-3, "IN_OUT: the second forward sees the engine's new weights");
      } else {
        RANK_EXPECT(diff12 == 0, "OUT_IN: the copy made at bind stays until sync");
        CAPI_THROW_UNLESS_OK(meshrt_mlp_backward(mlp, dy.h, dx.h, &g, nullptr, nullptr));
        CAPI_THROW_UNLESS_OK(meshrt_mlp_sync_weights(mlp, nullptr, nullptr));
        forward(y3);
        double diff13 = 0;
        for (size_t i = 0; i < y1.v.size(); ++i)
          diff13 = std::max(diff13, double(std::fabs(y1.v[i] - y3.v[i])));
        RANK_EXPECT(diff13 > 1e-3, "OUT_IN: sync copies the engine's new weights");
      }
      CAPI_THROW_UNLESS_OK(meshrt_mlp_destroy(mlp));
      CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
    });
  }
}

TEST_CASE("capi: bad MLP configs and shards and tensors case by case", "[capi]") {
  World w(1);
  meshrt_mesh_t mesh = nullptr;
  CAPI_REQUIRE_OK(meshrt_mesh_create(&mesh, w.comms[0], "tp=1"));
  const Shape3 d{4, 1, 8, 6};
  const Variant var{true, true, false};
  meshrt_mlp_config_t cfg = mlp_config(d, var, false, MESHRT_WEIGHT_LAYOUT_OUT_IN);
  meshrt_mlp_t mlp = nullptr;
  SECTION("config") {
    require_status(meshrt_mlp_create(&mlp, mesh, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"config is NULL"});
    meshrt_mlp_config_t c = cfg;
    c.weight_layout = 7;
    require_status(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"meshrt_mlp_config.weight_layout is 7", "MESHRT_WEIGHT_LAYOUT_OUT_IN"});
    c = cfg;
    c.norm = -1;
    require_status(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"meshrt_mlp_config.norm is -1"});
    c = cfg;
    c.dtype = dl_dtype(kDLInt, 32);
    require_status(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"meshrt_mlp_config.dtype", "bits 32", "float32 {kDLFloat, 32, 1}"});
    c = cfg;
    c.size = 3;
    require_status(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"meshrt_mlp_config.size is 3", "MESHRT_MLP_CONFIG_INITIALIZER"});
    c = cfg;
    c.hidden = 0;
    require_status(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"meshrt_mlp_config.hidden is 0"});
    CHECK(mlp == nullptr);
  }
  SECTION("shards and tensors") {
    CAPI_REQUIRE_OK(meshrt_mlp_create(&mlp, mesh, &cfg));
    F32 gamma({8}), beta({8}), w1({6, 8}), b1({6}), w2({8, 6}), b2({8}), bad({8, 6});
    meshrt_mlp_params_t p = mlp_params(gamma.h, beta.h, w1.h, b1.h, w2.h, b2.h);
    F32 x({4, 1, 8}), y({4, 1, 8});
    require_status(meshrt_mlp_forward(mlp, x.h, y.h, nullptr, nullptr), MESHRT_ERROR_INVALID_USAGE,
                   {"meshrt_mlp_bind_weights"});
    meshrt_mlp_params_t q = p;
    q.fc1_weight = bad.h;  // [hidden, ffn]: the IN_OUT shape given for OUT_IN
    require_status(meshrt_mlp_bind_weights(mlp, &q), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"weights->fc1_weight", "[8, 6]", "[6, 8]", "meshrt_mlp_shard_info"});
    q = p;
    q.norm_bias = nullptr;
    require_status(meshrt_mlp_bind_weights(mlp, &q), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"weights->norm_bias is NULL"});
    q = p;
    q.size = 0;
    require_status(meshrt_mlp_bind_weights(mlp, &q), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"weights->size is 0"});
    require_status(meshrt_mlp_bind_weights(mlp, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"weights is NULL"});
    Buf half(dl_dtype(kDLBfloat, 16), 8);
    q = p;
    q.norm_weight = half.handle();
    require_status(meshrt_mlp_bind_weights(mlp, &q), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"dtype bf16", "f32"});
    {  // a CUDA tensor on a CPU mesh (never dereferenced)
      int64_t shape[1] = {8};
      float fake[8];
      DLTensor t{};
      t.data = fake;
      t.device.device_type = kDLCUDA;
      t.ndim = 1;
      t.dtype = dl_dtype(kDLFloat, 32);
      t.shape = shape;
      meshrt_tensor_t ct = nullptr;
      CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(&t, &ct));
      q = p;
      q.norm_weight = ct;
      require_status(meshrt_mlp_bind_weights(mlp, &q), MESHRT_ERROR_INVALID_ARGUMENT,
                     {"cuda:0", "mesh's device"});
      CAPI_REQUIRE_OK(meshrt_tensor_destroy(ct));
    }
    int64_t off = -1, n = -1;
    require_status(meshrt_mlp_shard_info(mlp, static_cast<meshrt_mlp_param_t>(9), &off, &n),
                   MESHRT_ERROR_INVALID_ARGUMENT, {"which 9"});
    CAPI_REQUIRE_OK(meshrt_mlp_bind_weights(mlp, &p));
    F32 x2({4, 1, 6});
    require_status(meshrt_mlp_forward(mlp, x2.h, y.h, nullptr, nullptr),
                   MESHRT_ERROR_INVALID_ARGUMENT, {"[4, 1, 6]", "hidden=8"});
    require_status(meshrt_mlp_forward(mlp, x.h, x.h, nullptr, nullptr),
                   MESHRT_ERROR_INVALID_ARGUMENT, {"y aliases x"});
    require_status(meshrt_mlp_forward(mlp, x.h, nullptr, nullptr, nullptr),
                   MESHRT_ERROR_INVALID_ARGUMENT, {"y is NULL"});
    F32 dx({4, 1, 8});
    require_status(meshrt_mlp_backward(mlp, y.h, dx.h, &p, nullptr, nullptr),
                   MESHRT_ERROR_INVALID_USAGE, {"without a forward"});
    CAPI_REQUIRE_OK(meshrt_mlp_destroy(mlp));
    require_status(meshrt_mlp_forward(mlp, x.h, y.h, nullptr, nullptr), MESHRT_ERROR_INVALID_USAGE,
                   {"not a live mlp"});
  }
  SECTION("destroyed mesh") {
    meshrt_mesh_t m2 = nullptr;
    CAPI_REQUIRE_OK(meshrt_mesh_create(&m2, w.comms[0], "tp=1"));
    CAPI_REQUIRE_OK(meshrt_mesh_destroy(m2));
    require_status(meshrt_mlp_create(&mlp, m2, &cfg), MESHRT_ERROR_INVALID_USAGE,
                   {"not a live mesh"});
  }
  CAPI_REQUIRE_OK(meshrt_mesh_destroy(mesh));
}
