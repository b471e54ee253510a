// The sharded attention block of the C API: on 2 and 4 thread ranks, in every weight layout
// ([in, out] / [out, in]) and fused-QKV order (per-head [q|k|v] / blocked [Q|K|V]), causal or not,
// with and without sequence parallel, the output, the input gradient and this rank's weight
// gradients (in the declared layout) equal a double-precision loop over the full weights; the
// MLP and attention blocks in bf16 and f16 too; on a cp mesh (threads and 2 shm processes, ring
// and allgather) the rank's CpLayout shard against the same loop over the whole sequence; bad
// inputs get a status naming what to change.
#include <cmath>
#include <cstddef>
#include <string>

#include "capi_test_util.h"

using namespace capi_test;

namespace {

struct AttnDims {
  int64_t seq = 8, batch = 2, hidden = 16, heads = 4;
  int64_t head_dim() const { return hidden / heads; }
};

struct AttnVariant {
  bool layernorm = true, bias = true, causal = true;
};

// Full weights in canonical form: q / k / v projections wqkv[j] ([in, out], [hidden, hidden],
// output feature c = head * d + e), their biases, the output projection wp [hidden, hidden] and
// its bias; and the naive block over rows (s, b) of [seq, batch, hidden].
struct AttnRef {
  AttnDims d;
  AttnVariant var;
  std::vector<double> gamma, beta, wqkv[3], bqkv[3], wp, bp;
  AttnRef(const AttnDims& dims, const AttnVariant& v) : d(dims), var(v) {
    const auto h = static_cast<size_t>(d.hidden);
    gamma.resize(h);
    beta.assign(h, 0.0);
    bp.assign(h, 0.0);
    wp.resize(h * h);
    for (size_t i = 0; i < h; ++i) gamma[i] = 1.0 + val(1, int64_t(i), 0.3);
    for (size_t i = 0; i < h * h; ++i) wp[i] = val(5, int64_t(i), 0.4);
    for (int j = 0; j < 3; ++j) {
      wqkv[j].resize(h * h);
      bqkv[j].assign(h, 0.0);
      for (size_t i = 0; i < h * h; ++i) wqkv[j][i] = val(10 + uint64_t(j), int64_t(i), 0.5);
      if (v.bias)
        for (size_t i = 0; i < h; ++i) bqkv[j][i] = val(20 + uint64_t(j), int64_t(i), 0.3);
    }
    if (v.layernorm)
      for (size_t i = 0; i < h; ++i) beta[i] = val(2, int64_t(i), 0.3);
    if (v.bias)
      for (size_t i = 0; i < h; ++i) bp[i] = val(6, int64_t(i), 0.3);
  }

  struct Grads {
    std::vector<double> gamma, beta, wqkv[3], bqkv[3], wp, bp;
    explicit Grads(int64_t hidden) {
      const auto h = static_cast<size_t>(hidden);
      gamma.assign(h, 0.0);
      beta.assign(h, 0.0);
      bp.assign(h, 0.0);
      wp.assign(h * h, 0.0);
      for (int j = 0; j < 3; ++j) {
        wqkv[j].assign(h * h, 0.0);
        bqkv[j].assign(h, 0.0);
      }
    }
  };

  // out = block(x); dx and the gradients (added to g) for dout.
  void run(const std::vector<double>& x, const std::vector<double>& dout, std::vector<double>& out,
           std::vector<double>& dx, Grads& g) const {
    const int64_t S = d.seq, B = d.batch, H = d.hidden, NH = d.heads, D = d.head_dim();
    const int64_t rows = S * B;
    auto at = [H](int64_t row, int64_t c) { return static_cast<size_t>(row * H + c); };
    std::vector<std::vector<double>> n(static_cast<size_t>(rows)), ln(n.size());
    std::vector<double> rstd(n.size());
    std::vector<double> qkv[3], o(x.size(), 0.0), dqkv[3];
    for (int j = 0; j < 3; ++j) {
      qkv[j].assign(x.size(), 0.0);
      dqkv[j].assign(x.size(), 0.0);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const auto k = static_cast<size_t>(r);
      rstd[k] = norm_row(&x[at(r, 0)], H, gamma, beta, var.layernorm, 1e-5, n[k], ln[k]);
      for (int j = 0; j < 3; ++j)
        for (int64_t c = 0; c < H; ++c) {
          double s = bqkv[j][static_cast<size_t>(c)];
          for (int64_t i = 0; i < H; ++i) s += ln[k][static_cast<size_t>(i)] * wqkv[j][at(i, c)];
          qkv[j][at(r, c)] = s;
        }
    }
    const double scale = 1 / std::sqrt(static_cast<double>(D));
    // P[b][h][s][t], the softmax of each (batch, head).
    std::vector<double> P(static_cast<size_t>(B * NH * S * S), 0.0);
    auto pi = [&](int64_t b, int64_t hh, int64_t s, int64_t t) {
      return static_cast<size_t>(((b * NH + hh) * S + s) * S + t);
    };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < NH; ++hh)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t tend = var.causal ? s + 1 : S;
          double mx = -1e300, sum = 0;
          for (int64_t t = 0; t < tend; ++t) {
            double z = 0;
            for (int64_t e = 0; e < D; ++e)
              z += qkv[0][at(s * B + b, hh * D + e)] * qkv[1][at(t * B + b, hh * D + e)];
            P[pi(b, hh, s, t)] = z * scale;
            mx = std::max(mx, z * scale);
          }
          for (int64_t t = 0; t < tend; ++t)
            sum += (P[pi(b, hh, s, t)] = std::exp(P[pi(b, hh, s, t)] - mx));
          for (int64_t t = 0; t < tend; ++t) {
            P[pi(b, hh, s, t)] /= sum;
            for (int64_t e = 0; e < D; ++e)
              o[at(s * B + b, hh * D + e)] +=
                  P[pi(b, hh, s, t)] * qkv[2][at(t * B + b, hh * D + e)];
          }
        }
    out.assign(x.size(), 0.0);
    std::vector<double> dO(x.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < H; ++c) {
        double s = bp[static_cast<size_t>(c)];
        for (int64_t i = 0; i < H; ++i) {
          s += o[at(r, i)] * wp[at(i, c)];
          g.wp[at(i, c)] += o[at(r, i)] * dout[at(r, c)];
          dO[at(r, i)] += dout[at(r, c)] * wp[at(i, c)];
        }
        out[at(r, c)] = x[at(r, c)] + s;
        g.bp[static_cast<size_t>(c)] += dout[at(r, c)];
      }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < NH; ++hh)
        for (int64_t s = 0; s < S; ++s) {
          const int64_t tend = var.causal ? s + 1 : S;
          std::vector<double> dP(static_cast<size_t>(tend));
          double dot = 0;
          for (int64_t t = 0; t < tend; ++t) {
            double z = 0;
            for (int64_t e = 0; e < D; ++e) {
              z += dO[at(s * B + b, hh * D + e)] * qkv[2][at(t * B + b, hh * D + e)];
              dqkv[2][at(t * B + b, hh * D + e)] +=
                  P[pi(b, hh, s, t)] * dO[at(s * B + b, hh * D + e)];
            }
            dP[static_cast<size_t>(t)] = z;
            dot += z * P[pi(b, hh, s, t)];
          }
          for (int64_t t = 0; t < tend; ++t) {
            const double dS = P[pi(b, hh, s, t)] * (dP[static_cast<size_t>(t)] - dot) * scale;
            for (int64_t e = 0; e < D; ++e) {
              dqkv[0][at(s * B + b, hh * D + e)] += dS * qkv[1][at(t * B + b, hh * D + e)];
              dqkv[1][at(t * B + b, hh * D + e)] += dS * qkv[0][at(s * B + b, hh * D + e)];
            }
          }
        }
    dx.assign(x.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const auto k = static_cast<size_t>(r);
      std::vector<double> dln(static_cast<size_t>(H), 0.0);
      for (int j = 0; j < 3; ++j)
        for (int64_t c = 0; c < H; ++c) {
          const double gq = dqkv[j][at(r, c)];
          g.bqkv[j][static_cast<size_t>(c)] += gq;
          for (int64_t i = 0; i < H; ++i) {
            g.wqkv[j][at(i, c)] += ln[k][static_cast<size_t>(i)] * gq;
            dln[static_cast<size_t>(i)] += gq * wqkv[j][at(i, c)];
          }
        }
      norm_row_backward(dln, n[k], rstd[k], gamma, var.layernorm, g.gamma, g.beta, &dx[at(r, 0)]);
      for (int64_t c = 0; c < H; ++c) dx[at(r, c)] += dout[at(r, c)];
    }
  }
};

// This rank's shard of a canonical q / k / v triple in the declared layout: qkv weight (from
// w[j] [hidden, hidden]) or bias (from b[j] [hidden]) for heads [h0, h0 + hl).
std::vector<double> qkv_shard(const std::vector<double> (&w)[3], int64_t rows, int64_t hidden,
                              int64_t h0, int64_t hl, int64_t d, bool blocked, bool out_in) {
  const int64_t feats = 3 * hl * d;
  std::vector<double> out(static_cast<size_t>(rows * feats));
  for (int64_t hh = 0; hh < hl; ++hh)
    for (int j = 0; j < 3; ++j)
      for (int64_t e = 0; e < d; ++e) {
        const int64_t f = blocked ? j * hl * d + hh * d + e : hh * 3 * d + j * d + e;
        const int64_t c = (h0 + hh) * d + e;  // canonical output feature
        for (int64_t i = 0; i < rows; ++i) {
          const double v = w[j][static_cast<size_t>(i * hidden + c)];
          out[static_cast<size_t>(out_in ? f * rows + i : i * feats + f)] = v;
        }
      }
  return out;
}

// Rows [r0, r0 + nr) of the proj weight [hidden, hidden] (out_in: as columns of its transpose).
std::vector<double> proj_shard(const std::vector<double>& w, int64_t hidden, int64_t r0, int64_t nr,
                               bool out_in) {
  std::vector<double> out(static_cast<size_t>(nr * hidden));
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t c = 0; c < hidden; ++c)
      out[static_cast<size_t>(out_in ? c * nr + r : r * hidden + c)] =
          w[static_cast<size_t>((r0 + r) * hidden + c)];
  return out;
}

struct Layout {
  int weight = MESHRT_WEIGHT_LAYOUT_IN_OUT;
  int qkv = MESHRT_QKV_LAYOUT_PER_HEAD;
};

meshrt_attn_config_t attn_config(const AttnDims& d, const AttnVariant& v, bool sp, Layout l,
                                 DLDataType dt) {
  meshrt_attn_config_t c = MESHRT_ATTN_CONFIG_INITIALIZER;
  c.hidden = d.hidden;
  c.heads = d.heads;
  c.dtype = dt;
  c.norm = v.layernorm ? MESHRT_NORM_LAYERNORM : MESHRT_NORM_RMSNORM;
  c.bias = v.bias ? 1 : 0;
  c.causal = v.causal ? 1 : 0;
  c.sequence_parallel = sp ? 1 : 0;
  c.weight_layout = l.weight;
  c.qkv_layout = l.qkv;
  return c;
}

meshrt_attn_params_t attn_params(meshrt_tensor_t gamma, meshrt_tensor_t beta, meshrt_tensor_t wq,
                                 meshrt_tensor_t bq, meshrt_tensor_t wp, meshrt_tensor_t bp) {
  meshrt_attn_params_t p = MESHRT_ATTN_PARAMS_INITIALIZER;
  p.norm_weight = gamma;
  p.norm_bias = beta;
  p.qkv_weight = wq;
  p.qkv_bias = bq;
  p.proj_weight = wp;
  p.proj_bias = bp;
  return p;
}

// One rank: binds its shards, runs forward + backward twice (gradients add up) and compares
// everything with the reference.
// Under a cp dim the rank's activations are its cp shard (chunks i and 2cp-1-i of 2 cp) and its
// weight gradients its tokens' part, summed over cp (all_reduce on the mesh's cp communicator)
// before the comparison.
void run_rank(meshrt_comm_t comm, const char* spec, const AttnDims& d, const AttnVariant& var,
              bool sp, Layout lay, DLDataType dt, double tol, int cp_comm = MESHRT_CP_COMM_RING) {
  meshrt_mesh_t mesh = nullptr;
  CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, comm, spec));
  int tp = 0, tr = 0, dpc = 0, cp = 0, cr = 0;
  CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "tp", &tp, &tr));
  CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "dp", nullptr, &dpc));
  CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(mesh, "cp", &cp, &cr));
  meshrt_comm_t cpc = nullptr;
  if (cp > 1) CAPI_THROW_UNLESS_OK(meshrt_mesh_comm(mesh, "cp", &cpc));
  meshrt_attn_config_t cfg = attn_config(d, var, sp, lay, dt);
  cfg.cp_comm = cp_comm;
  meshrt_attn_t attn = nullptr;
  CAPI_THROW_UNLESS_OK(meshrt_attn_create(&attn, mesh, &cfg));
  const int64_t H = d.hidden, D = d.head_dim(), hl = d.heads / tp, h0 = tr * hl;
  int64_t oq = -1, nq = -1, ob = -1, nb = -1, op = -1, np = -1, og = -1, ng = -1;
  CAPI_THROW_UNLESS_OK(meshrt_attn_shard_info(attn, MESHRT_ATTN_QKV_WEIGHT, &oq, &nq));
  CAPI_THROW_UNLESS_OK(meshrt_attn_shard_info(attn, MESHRT_ATTN_QKV_BIAS, &ob, &nb));
  CAPI_THROW_UNLESS_OK(meshrt_attn_shard_info(attn, MESHRT_ATTN_PROJ_WEIGHT, &op, &np));
  CAPI_THROW_UNLESS_OK(meshrt_attn_shard_info(attn, MESHRT_ATTN_PROJ_BIAS, &og, &ng));
  RANK_EXPECT(oq == h0 * 3 * D && nq == hl * 3 * D && ob == oq && nb == nq,
              "qkv shard: 3 d features per head of the rank's heads");
  RANK_EXPECT(op == h0 * D && np == hl * D && og == 0 && ng == H,
              "proj shard: d rows per head; its bias replicated");
  const AttnRef ref(d, var);
  const bool oi = lay.weight == MESHRT_WEIGHT_LAYOUT_OUT_IN;
  const bool blk = lay.qkv == MESHRT_QKV_LAYOUT_BLOCKED;
  const std::vector<int64_t> sq = oi ? std::vector<int64_t>{nq, H} : std::vector<int64_t>{H, nq};
  const std::vector<int64_t> sp_ = oi ? std::vector<int64_t>{H, np} : std::vector<int64_t>{np, H};
  Mat gamma({H}, dt), beta({H}, dt), wq(sq, dt), bq({nq}, dt), wp(sp_, dt), bp({H}, dt);
  gamma.load(ref.gamma);
  beta.load(ref.beta);
  wq.load(qkv_shard(ref.wqkv, H, H, h0, hl, D, blk, oi));
  bq.load(qkv_shard(ref.bqkv, 1, H, h0, hl, D, blk, false));
  wp.load(proj_shard(ref.wp, H, op, np, oi));
  bp.load(ref.bp);
  auto opt = [](bool on, meshrt_tensor_t t) { return on ? t : nullptr; };
  const meshrt_attn_params_t w = attn_params(gamma.h, opt(var.layernorm, beta.h), wq.h,
                                             opt(var.bias, bq.h), wp.h, opt(var.bias, bp.h));
  CAPI_THROW_UNLESS_OK(meshrt_attn_bind_weights(attn, &w));
  const int64_t rows = d.seq * d.batch;
  std::vector<double> x(static_cast<size_t>(rows * H)), dout(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = val(100 + static_cast<uint64_t>(dpc), static_cast<int64_t>(i), 1.5);
    dout[i] = val(200 + static_cast<uint64_t>(dpc), static_cast<int64_t>(i), 1.0);
  }
  // The cp shard's global positions (docs/capi.md): chunk cr, then chunk 2cp-1-cr; then its
  // rows [s0, s0 + sl) under sequence parallel.
  const int64_t c = d.seq / (2 * cp), sl = sp ? d.seq / cp / tp : d.seq / cp, s0 = sp ? tr * sl : 0;
  auto local = [&](const std::vector<double>& v) {
    std::vector<double> out;
    for (int64_t j = s0; j < s0 + sl; ++j) {
      const int64_t pos = j < c ? cr * c + j : (2 * cp - 1 - cr) * c + (j - c);
      out.insert(out.end(), v.begin() + pos * d.batch * H, v.begin() + (pos + 1) * d.batch * H);
    }
    return out;
  };
  // A weight gradient summed over cp (the engine's all-reduce; itself when cp = 1).
  auto cp_sum = [&](const Mat& g, const std::vector<int64_t>& shape) {
    if (cp == 1) return g.values();
    Mat sum(shape, dt);
    meshrt_event_t ev = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_all_reduce(cpc, g.h, sum.h, MESHRT_SUM, nullptr, &ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    return sum.values();
  };
  Mat xt({sl, d.batch, H}, dt), yt({sl, d.batch, H}, dt), dyt({sl, d.batch, H}, dt),
      dxt({sl, d.batch, H}, dt);
  xt.load(local(x));
  dyt.load(local(dout));
  Mat ggam({H}, dt), gbeta({H}, dt), gwq(sq, dt), gbq({nq}, dt), gwp(sp_, dt), gbp({H}, dt);
  const meshrt_attn_params_t g = attn_params(ggam.h, opt(var.layernorm, gbeta.h), gwq.h,
                                             opt(var.bias, gbq.h), gwp.h, opt(var.bias, gbp.h));
  std::vector<double> out, dx;
  AttnRef::Grads rg(H);
  ref.run(x, dout, out, dx, rg);
  const std::string where = std::string(spec) + (sp ? " sp" : "") + (oi ? " OUT_IN" : " IN_OUT") +
                            (blk ? " [Q|K|V]" : " [q|k|v]") + (var.causal ? " causal" : " full") +
                            (var.layernorm ? " layernorm" : " rmsnorm") +
                            (var.bias ? " bias" : " no-bias") + " tp rank " + std::to_string(tr) +
                            " dp " + std::to_string(dpc) + " cp " + std::to_string(cr) +
                            (cp_comm == MESHRT_CP_COMM_ALLGATHER ? " allgather" : " ring");
  for (int step = 1; step <= 2; ++step) {
    meshrt_event_t ev = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_attn_forward(attn, xt.h, yt.h, nullptr, &ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    expect_close(yt.values(), local(out), "y", where, tol);
    CAPI_THROW_UNLESS_OK(meshrt_attn_backward(attn, dyt.h, dxt.h, &g, nullptr, &ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
    expect_close(dxt.values(), local(dx), "dx", where, tol);
    const double k = step;
    expect_close(cp_sum(ggam, {H}), scaled(rg.gamma, k), "norm_weight grad", where, tol);
    if (var.layernorm)
      expect_close(cp_sum(gbeta, {H}), scaled(rg.beta, k), "norm_bias grad", where, tol);
    expect_close(cp_sum(gwq, sq), scaled(qkv_shard(rg.wqkv, H, H, h0, hl, D, blk, oi), k),
                 "qkv_weight grad", where, tol);
    expect_close(cp_sum(gwp, sp_), scaled(proj_shard(rg.wp, H, op, np, oi), k), "proj_weight grad",
                 where, tol);
    if (var.bias) {
      expect_close(cp_sum(gbq, {nq}), scaled(qkv_shard(rg.bqkv, 1, H, h0, hl, D, blk, false), k),
                   "qkv_bias grad", where, tol);
      expect_close(cp_sum(gbp, {H}), scaled(rg.bp, k), "proj_bias grad", where, tol);
    }
  }
  CAPI_THROW_UNLESS_OK(meshrt_attn_destroy(attn));
  CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
}

}  // namespace

TEST_CASE("capi: sharded attention equals a double loop in every weight and QKV layout",
          "[capi][multirank]") {
  struct Case {
    int n;
    const char* spec;
  };
  const DLDataType f32 = dl_dtype(kDLFloat, 32);
  for (Case c : {Case{2, "tp=2"}, Case{4, "dp=2,tp=2"}}) {
    for (bool sp : {false, true}) {
      for (Layout lay : {Layout{MESHRT_WEIGHT_LAYOUT_IN_OUT, MESHRT_QKV_LAYOUT_PER_HEAD},
                         Layout{MESHRT_WEIGHT_LAYOUT_IN_OUT, MESHRT_QKV_LAYOUT_BLOCKED},
                         Layout{MESHRT_WEIGHT_LAYOUT_OUT_IN, MESHRT_QKV_LAYOUT_PER_HEAD},
                         Layout{MESHRT_WEIGHT_LAYOUT_OUT_IN, MESHRT_QKV_LAYOUT_BLOCKED}}) {
        for (AttnVariant v : {AttnVariant{true, true, true}, AttnVariant{false, false, false}}) {
          INFO(c.spec << (sp ? " sp" : "") << " weight layout " << lay.weight << " qkv layout "
                      << lay.qkv << " causal " << v.causal);
          World w(c.n);
          run_ranks(c.n, [&](int r) {
            run_rank(w.comms[static_cast<size_t>(r)], c.spec, AttnDims{}, v, sp, lay, f32, 1e-4);
          });
        }
      }
    }
  }
}

TEST_CASE("capi: attention on 4 tp ranks, one head each", "[capi][multirank]") {
  World w(4);
  run_ranks(4, [&](int r) {
    run_rank(w.comms[static_cast<size_t>(r)], "tp=4", AttnDims{}, AttnVariant{}, true,
             Layout{MESHRT_WEIGHT_LAYOUT_OUT_IN, MESHRT_QKV_LAYOUT_BLOCKED}, dl_dtype(kDLFloat, 32),
             1e-4);
  });
}

TEST_CASE("capi: attention on a cp mesh takes the CpLayout shard and equals the double loop",
          "[capi][multirank]") {
  // cp=2 alone and with tp=2 (sequence parallel on and off), both K/V exchanges, causal and not:
  // y and dx on each rank's chunks i and 2cp-1-i, and the weight gradients summed over cp, equal
  // the unsharded block's (a double loop over the full sequence).
  struct Case {
    int n;
    const char* spec;
    bool sp;
  };
  const AttnDims dims{16, 2, 16, 4};
  for (Case c : {Case{2, "cp=2", false}, Case{4, "cp=2,tp=2", false}, Case{4, "cp=2,tp=2", true}})
    for (int how : {MESHRT_CP_COMM_RING, MESHRT_CP_COMM_ALLGATHER})
      for (AttnVariant v : {AttnVariant{true, true, true}, AttnVariant{false, false, false}}) {
        INFO(c.spec << (c.sp ? " sp" : "") << " cp_comm " << how << " causal " << v.causal);
        World w(c.n);
        run_ranks(c.n, [&](int r) {
          run_rank(w.comms[static_cast<size_t>(r)], c.spec, dims, v, c.sp,
                   Layout{MESHRT_WEIGHT_LAYOUT_OUT_IN, MESHRT_QKV_LAYOUT_BLOCKED},
                   dl_dtype(kDLFloat, 32), 1e-4, how);
        });
      }
}

TEST_CASE("capi: attention on cp=2 over 2 shm processes equals the double loop", "[capi][file]") {
  // The same check with the cp ranks as 2 forked processes (file rendezvous, shm backend).
  for (int how : {MESHRT_CP_COMM_RING, MESHRT_CP_COMM_ALLGATHER}) {
    const std::string dir = fresh_dir(how == MESHRT_CP_COMM_RING ? "cp-ring" : "cp-allgather");
    const auto [rc0, rc1] = run_two_ranks([&](int rank) {
      init_api();
      const meshrt_comm_config_t cfg = test_config(60);
      meshrt_comm_t comm = nullptr;
      if (meshrt_comm_init_file(&comm, dir.c_str(), 2, rank, &cfg) != MESHRT_SUCCESS) {
        std::printf("rank %d: init: %s\n", rank, meshrt_last_error());
        return 1;
      }
      const char* backend = nullptr;
      if (meshrt_comm_backend(comm, &backend) != MESHRT_SUCCESS || std::string(backend) != "shm") {
        std::printf("rank %d: backend %s, expected shm\n", rank, backend ? backend : "?");
        return 2;
      }
      try {
        run_rank(comm, "cp=2", AttnDims{16, 2, 16, 4}, AttnVariant{}, false, Layout{},
                 dl_dtype(kDLFloat, 32), 1e-4, how);
      } catch (const std::exception& e) {
        std::printf("rank %d: %s\n", rank, e.what());
        return 3;
      }
      return meshrt_comm_destroy(comm) == MESHRT_SUCCESS ? 0 : 4;
    });
    INFO("cp_comm " << how);
    CHECK(rc0 == 0);
    CHECK(rc1 == 0);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("capi: attention in bf16 and f16 stays within 16-bit rounding of the double loop",
          "[capi][multirank]") {
  // Inputs are rounded to 16 bits and the block rounds activations between its steps; the
  // reference sees the unrounded values. 3e-2 of the largest magnitude covers bf16's 8-bit
  // mantissa over these sums of 16 terms; a wrong layout errs by O(1).
  for (DtypeCase dc :
       {DtypeCase{"bf16", dl_dtype(kDLBfloat, 16)}, DtypeCase{"f16", dl_dtype(kDLFloat, 16)}}) {
    INFO(dc.name);
    World w(2);
    run_ranks(2, [&](int r) {
      run_rank(w.comms[static_cast<size_t>(r)], "tp=2", AttnDims{}, AttnVariant{}, false,
               Layout{MESHRT_WEIGHT_LAYOUT_OUT_IN, MESHRT_QKV_LAYOUT_BLOCKED}, dc.dt, 3e-2);
    });
  }
}

TEST_CASE("capi: bad attention configs and shards case by case", "[capi]") {
  World w(2);
  run_ranks(2, [&](int r) {
    meshrt_comm_t comm = w.comms[static_cast<size_t>(r)];
    meshrt_mesh_t mesh = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, comm, "tp=2"));
    const AttnDims d;
    const DLDataType f32 = dl_dtype(kDLFloat, 32);
    auto expect = [&](meshrt_status_t got, meshrt_status_t want, std::vector<std::string> parts) {
      const std::string msg = meshrt_last_error();
      RANK_EXPECT(got == want, msg);
      for (const auto& p : parts) RANK_EXPECT(msg.find(p) != std::string::npos, p + " in: " + msg);
    };
    meshrt_attn_t attn = nullptr;
    meshrt_attn_config_t c = attn_config(d, AttnVariant{}, false, Layout{}, f32);
    c.heads = 3;  // not a divisor of tp = 2 nor of hidden = 16
    expect(meshrt_attn_create(&attn, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT, {"heads"});
    c = attn_config(d, AttnVariant{}, false, Layout{}, f32);
    c.qkv_layout = 5;
    expect(meshrt_attn_create(&attn, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
           {"meshrt_attn_config.qkv_layout is 5", "MESHRT_QKV_LAYOUT_BLOCKED"});
    c = attn_config(d, AttnVariant{}, false, Layout{}, f32);
    c.causal = 2;
    expect(meshrt_attn_create(&attn, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
           {"meshrt_attn_config.causal is 2"});
    c = attn_config(d, AttnVariant{}, false, Layout{}, f32);
    c.size = 1;
    expect(meshrt_attn_create(&attn, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
           {"meshrt_attn_config.size is 1", "MESHRT_ATTN_CONFIG_INITIALIZER"});
    RANK_EXPECT(attn == nullptr, "no handle after a refused create");
    c = attn_config(d, AttnVariant{}, false,
                    Layout{MESHRT_WEIGHT_LAYOUT_OUT_IN, MESHRT_QKV_LAYOUT_BLOCKED}, f32);
    CAPI_THROW_UNLESS_OK(meshrt_attn_create(&attn, mesh, &c));
    // hl = 2 heads of d = 4: qkv OUT_IN [24, 16]; the IN_OUT shape [16, 24] is refused.
    Mat gamma({16}, f32), beta({16}, f32), wq({24, 16}, f32), bq({24}, f32), wp({16, 8}, f32),
        bp({16}, f32), bad({16, 24}, f32);
    meshrt_attn_params_t p = attn_params(gamma.h, beta.h, bad.h, bq.h, wp.h, bp.h);
    expect(meshrt_attn_bind_weights(attn, &p), MESHRT_ERROR_INVALID_ARGUMENT,
           {"weights->qkv_weight", "[16, 24]", "[24, 16]", "meshrt_attn_shard_info"});
    p = attn_params(gamma.h, beta.h, wq.h, bq.h, wp.h, bp.h);
    p.size = 0;
    expect(meshrt_attn_bind_weights(attn, &p), MESHRT_ERROR_INVALID_ARGUMENT,
           {"weights->size is 0", "MESHRT_ATTN_PARAMS_INITIALIZER"});
    int64_t off = 0, n = 0;
    expect(meshrt_attn_shard_info(attn, static_cast<meshrt_attn_param_t>(6), &off, &n),
           MESHRT_ERROR_INVALID_ARGUMENT, {"which 6", "MESHRT_ATTN_PROJ_BIAS"});
    Mat x({8, 2, 16}, f32), y({8, 2, 16}, f32);
    expect(meshrt_attn_forward(attn, x.h, y.h, nullptr, nullptr), MESHRT_ERROR_INVALID_USAGE,
           {"meshrt_attn_bind_weights"});
    expect(meshrt_attn_sync_weights(attn, nullptr, nullptr), MESHRT_ERROR_INVALID_USAGE,
           {"meshrt_attn_bind_weights"});
    // Another kind of handle (a mesh) is not an attention handle.
    expect(meshrt_attn_forward(reinterpret_cast<meshrt_attn_t>(mesh), x.h, y.h, nullptr, nullptr),
           MESHRT_ERROR_INVALID_USAGE, {"attn"});
    CAPI_THROW_UNLESS_OK(meshrt_attn_destroy(attn));
    expect(meshrt_attn_destroy(attn), MESHRT_ERROR_INVALID_USAGE, {"destroyed already"});
    // A cp mesh: cp_comm out of range is refused; a config of the older size (ending at
    // qkv_layout) gets the ring; an odd cp shard (3 rows: a sequence of 6) is refused at forward.
    meshrt_mesh_t cpm = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&cpm, comm, "cp=2"));
    int cp_size = 0, cp_coord = -1;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_dim(cpm, "cp", &cp_size, &cp_coord));
    RANK_EXPECT(cp_size == 2 && cp_coord == r, "the cp dim: size 2, coordinate = rank");
    c = attn_config(d, AttnVariant{}, false, Layout{}, f32);
    c.cp_comm = 2;
    expect(meshrt_attn_create(&attn, cpm, &c), MESHRT_ERROR_INVALID_ARGUMENT,
           {"meshrt_attn_config.cp_comm is 2", "MESHRT_CP_COMM_ALLGATHER (1)"});
    c.size = offsetof(meshrt_attn_config_t, qkv_layout) + sizeof(int);
    CAPI_THROW_UNLESS_OK(meshrt_attn_create(&attn, cpm, &c));
    Mat cwq({16, 48}, f32), cbq({48}, f32), cwp({16, 16}, f32), x3({3, 2, 16}, f32),
        y3({3, 2, 16}, f32);
    p = attn_params(gamma.h, beta.h, cwq.h, cbq.h, cwp.h, bp.h);
    CAPI_THROW_UNLESS_OK(meshrt_attn_bind_weights(attn, &p));
    expect(meshrt_attn_forward(attn, x3.h, y3.h, nullptr, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
           {"x has shape [3, 2, 16]", "cp shard of 3 tokens",
            "the sequence (6 tokens) must divide by 2 x cp = 4"});
    CAPI_THROW_UNLESS_OK(meshrt_attn_destroy(attn));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(cpm));
    CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
  });
}

TEST_CASE("capi: IN_OUT per-head QKV weights are read in place, BLOCKED ones at bind and sync",
          "[capi][multirank]") {
  const DLDataType f32 = dl_dtype(kDLFloat, 32);
  for (int qkv : {MESHRT_QKV_LAYOUT_PER_HEAD, MESHRT_QKV_LAYOUT_BLOCKED}) {
    INFO("qkv layout " << qkv);
    World w(2);
    run_ranks(2, [&](int r) {
      meshrt_mesh_t mesh = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, w.comms[static_cast<size_t>(r)], "tp=2"));
      const AttnDims d;
      const AttnVariant var;
      const meshrt_attn_config_t cfg =
          attn_config(d, var, false, Layout{MESHRT_WEIGHT_LAYOUT_IN_OUT, qkv}, f32);
      meshrt_attn_t attn = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_attn_create(&attn, mesh, &cfg));
      const AttnRef ref(d, var);
      const bool blk = qkv == MESHRT_QKV_LAYOUT_BLOCKED;
      Mat gamma({16}, f32), beta({16}, f32), wq({16, 24}, f32), bq({24}, f32), wp({8, 16}, f32),
          bp({16}, f32);
      gamma.load(ref.gamma);
      beta.load(ref.beta);
      std::vector<double> wqv = qkv_shard(ref.wqkv, 16, 16, 2 * r, 2, 4, blk, false);
      wq.load(wqv);
      bq.load(qkv_shard(ref.bqkv, 1, 16, 2 * r, 2, 4, blk, false));
      wp.load(proj_shard(ref.wp, 16, 8 * r, 8, false));
      bp.load(ref.bp);
      const meshrt_attn_params_t p = attn_params(gamma.h, beta.h, wq.h, bq.h, wp.h, bp.h);
      CAPI_THROW_UNLESS_OK(meshrt_attn_bind_weights(attn, &p));
      Mat x({8, 2, 16}, f32), y1({8, 2, 16}, f32), y2({8, 2, 16}, f32), y3({8, 2, 16}, f32);
      std::vector<double> xv(static_cast<size_t>(x.size()));
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = val(9, int64_t(i), 1.0);
      x.load(xv);
      auto forward = [&](Mat& y) {
        meshrt_event_t ev = nullptr;
        CAPI_THROW_UNLESS_OK(meshrt_attn_forward(attn, x.h, y.h, nullptr, &ev));
        CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ev));
        CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ev));
      };
      auto diff = [](const Mat& a, const Mat& b) {
        double m = 0;
        const auto va = a.values(), vb = b.values();
        for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::fabs(va[i] - vb[i]));
        return m;
      };
      forward(y1);
      for (double& v : wqv) v *= 2;  // the engine changes its qkv shard in its own memory
      wq.load(wqv);
      forward(y2);
      if (!blk) {
        RANK_EXPECT(diff(y1, y2) > 1e-3, "per-head IN_OUT: the forward sees the new weights");
      } else {
        RANK_EXPECT(diff(y1, y2) == 0, "BLOCKED: the copy made at bind stays until sync");
        CAPI_THROW_UNLESS_OK(meshrt_attn_sync_weights(attn, nullptr, nullptr));
        forward(y3);
        RANK_EXPECT(diff(y1, y3) > 1e-3, "BLOCKED: sync copies the engine's new weights");
      }
      CAPI_THROW_UNLESS_OK(meshrt_attn_destroy(attn));
      CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
    });
  }
}
