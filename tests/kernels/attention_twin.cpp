// Host models of the CUDA attention kernels' numerics (see attention_twin.h). The loops follow
// backends/cuda/kernels/flash_attention.cuh: fwd_kernel per query row, bwd_dq_kernel per query row,
// bwd_dkdv_kernel per key; F is float for the twins, double for the float64 reference.
#include "attention_twin.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kt {

namespace {

constexpr int64_t kTwinKeys = 64;  // flash::kKeys: keys per tile of the forward
constexpr double kTwinLog2e = 1.4426950408889634;
constexpr double kTwinLn2 = 0.6931471805599453;

template <class F>
struct Arith {
  AttnNumerics num;
  DType dt;
  // An operand of a second product: flash rounds P and dS to 16 bits there (pack2).
  F mid(F x) const { return num == AttnNumerics::Flash ? static_cast<F>(round_to(x, dt)) : x; }
  // A stored output (store2 / store_f32): rounded to the dtype by both kernels.
  F store(F x) const { return num == AttnNumerics::Float64 ? x : static_cast<F>(round_to(x, dt)); }
  static F exp2(F x) { return std::exp2(x); }
  static F log(F x) { return std::log(x); }
};

// Inputs as F (the 16-bit values are exact in float), so dot products run in F.
template <class F>
std::vector<F> as(const Vec& x) {
  return std::vector<F>(x.begin(), x.end());
}

template <class F>
F dot(const F* a, const F* b, int64_t d) {
  F s = 0;
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

RowSet all_or(const RowSet& rows, int64_t n) {
  if (!rows.empty()) return rows;
  RowSet r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

// One query row of fwd_kernel: online softmax over 64-key tiles, m in log2 units, l from the
// unrounded P, O from the rounded P.
template <class F>
void fwd_row(const AttnProblem& p, const Arith<F>& ar, const F* qi, const F* K, const F* V,
             int64_t i, F* orow, double* lse) {
  const int64_t d = p.d;
  const F sl2 = static_cast<F>(static_cast<F>(p.scale) * static_cast<F>(kTwinLog2e));
  const F inf = std::numeric_limits<F>::infinity();
  F m = -inf, l = 0;
  std::vector<F> o(static_cast<size_t>(d), F(0)), x(kTwinKeys);
  const int64_t k_end = p.causal ? std::min(i + 1, p.sk) : p.sk;
  for (int64_t k0 = 0; k0 < k_end; k0 += kTwinKeys) {
    const int64_t kn = std::min(kTwinKeys, k_end - k0);
    F mx = -inf;
    for (int64_t j = 0; j < kn; ++j) {
      x[j] = dot(qi, K + (k0 + j) * d, d) * sl2;
      mx = std::max(mx, x[j]);
    }
    const F m_new = std::max(m, mx);
    const F m_use = m_new == -inf ? F(0) : m_new;
    const F alpha = Arith<F>::exp2(m - m_use);
    m = m_new;
    F sum = 0;
    for (int64_t c = 0; c < d; ++c) o[c] *= alpha;
    for (int64_t j = 0; j < kn; ++j) {
      const F pj = Arith<F>::exp2(x[j] - m_use);
      sum += pj;
      const F pr = ar.mid(pj);
      const F* vj = V + (k0 + j) * d;
      for (int64_t c = 0; c < d; ++c) o[c] += pr * vj[c];
    }
    l = l * alpha + sum;
  }
  const F inv = l > 0 ? F(1) / l : F(0);
  for (int64_t c = 0; c < d; ++c) orow[c] = ar.store(o[c] * inv);
  *lse = l > 0 ? static_cast<double>(m * static_cast<F>(kTwinLn2) + Arith<F>::log(l))
               : -std::numeric_limits<double>::infinity();
}

template <class F>
AttnFwd fwd(const AttnProblem& p, const Arith<F>& ar, const Vec& qv, const Vec& kv, const Vec& vv,
            const RowSet& rows) {
  const int64_t d = p.d;
  const std::vector<F> q = as<F>(qv), k = as<F>(kv), v = as<F>(vv);
  AttnFwd r;
  r.out.assign(static_cast<size_t>(p.bh * p.sq * d), 0.0);
  r.lse.assign(static_cast<size_t>(p.bh * p.sq), 0.0);
  std::vector<F> orow(static_cast<size_t>(d));
  for (int64_t h = 0; h < p.bh; ++h) {
    for (int64_t i : all_or(rows, p.sq)) {
      const int64_t row = h * p.sq + i;
      fwd_row(p, ar, q.data() + row * d, k.data() + h * p.sk * d, v.data() + h * p.sk * d, i,
              orow.data(), &r.lse[static_cast<size_t>(row)]);
      std::copy(orow.begin(), orow.end(), r.out.begin() + row * d);
    }
  }
  return r;
}

// One head's inputs to the backward as F, with lse in log2 units and D per query row.
template <class F>
struct BwdHead {
  const F *Q, *K, *V, *dO;
  std::vector<F> L2, D;
};

// dS_ij, and P_ij through *pij: bwd_dq_kernel's and bwd_dkdv_kernel's per-element math.
template <class F>
F dscore(const AttnProblem& p, const BwdHead<F>& hd, int64_t i, int64_t j, F sl2, F* pij) {
  const int64_t d = p.d;
  const F s = dot(hd.Q + i * d, hd.K + j * d, d);
  const F pr = Arith<F>::exp2(s * sl2 - hd.L2[i]);
  const F dp = dot(hd.dO + i * d, hd.V + j * d, d);
  *pij = pr;
  return pr * (dp - hd.D[i]);
}

template <class F>
AttnGrads bwd(const AttnProblem& p, const Arith<F>& ar, const Vec& qv, const Vec& kv, const Vec& vv,
              const Vec& ov, const Vec& gv, const Vec& lsev, const RowSet& q_rows,
              const RowSet& k_rows) {
  const int64_t d = p.d, sq = p.sq, sk = p.sk;
  const std::vector<F> q = as<F>(qv), k = as<F>(kv), v = as<F>(vv), o = as<F>(ov), g = as<F>(gv);
  const F sl2 = static_cast<F>(static_cast<F>(p.scale) * static_cast<F>(kTwinLog2e));
  const F scale = static_cast<F>(p.scale);
  AttnGrads r;
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<F> acc(static_cast<size_t>(d)), acc2(static_cast<size_t>(d));
  for (int64_t h = 0; h < p.bh; ++h) {
    BwdHead<F> hd{q.data() + h * sq * d,
                  k.data() + h * sk * d,
                  v.data() + h * sk * d,
                  g.data() + h * sq * d,
                  std::vector<F>(static_cast<size_t>(sq)),
                  std::vector<F>(static_cast<size_t>(sq))};
    for (int64_t i = 0; i < sq; ++i) {
      hd.L2[i] = static_cast<F>(lsev[static_cast<size_t>(h * sq + i)]) * static_cast<F>(kTwinLog2e);
      hd.D[i] = dot(hd.dO + i * d, o.data() + (h * sq + i) * d, d);
    }
    for (int64_t i : all_or(q_rows, sq)) {  // bwd_dq_kernel
      std::fill(acc.begin(), acc.end(), F(0));
      const int64_t j_end = p.causal ? std::min(i + 1, sk) : sk;
      for (int64_t j = 0; j < j_end; ++j) {
        F pij;
        const F ds = ar.mid(dscore(p, hd, i, j, sl2, &pij));
        for (int64_t c = 0; c < d; ++c) acc[c] += ds * hd.K[j * d + c];
      }
      for (int64_t c = 0; c < d; ++c) r.dq[(h * sq + i) * d + c] = ar.store(scale * acc[c]);
    }
    for (int64_t j : all_or(k_rows, sk)) {  // bwd_dkdv_kernel
      std::fill(acc.begin(), acc.end(), F(0));
      std::fill(acc2.begin(), acc2.end(), F(0));
      for (int64_t i = p.causal ? j : 0; i < sq; ++i) {
        F pij;
        const F ds = ar.mid(dscore(p, hd, i, j, sl2, &pij));
        const F pr = ar.mid(pij);
        for (int64_t c = 0; c < d; ++c) {
          acc[c] += ds * hd.Q[i * d + c];
          acc2[c] += pr * hd.dO[i * d + c];
        }
      }
      for (int64_t c = 0; c < d; ++c) {
        r.dk[(h * sk + j) * d + c] = ar.store(scale * acc[c]);
        r.dv[(h * sk + j) * d + c] = ar.store(acc2[c]);
      }
    }
  }
  return r;
}

}  // namespace

AttnFwd attn_model_fwd(const AttnProblem& p, AttnNumerics num, DType dt, const Vec& q, const Vec& k,
                       const Vec& v, const RowSet& rows) {
  if (num == AttnNumerics::Float64) return fwd(p, Arith<double>{num, dt}, q, k, v, rows);
  return fwd(p, Arith<float>{num, dt}, q, k, v, rows);
}

AttnGrads attn_model_bwd(const AttnProblem& p, AttnNumerics num, DType dt, const Vec& q,
                         const Vec& k, const Vec& v, const Vec& out, const Vec& dout,
                         const Vec& lse, const RowSet& q_rows, const RowSet& k_rows) {
  if (num == AttnNumerics::Float64)
    return bwd(p, Arith<double>{num, dt}, q, k, v, out, dout, lse, q_rows, k_rows);
  return bwd(p, Arith<float>{num, dt}, q, k, v, out, dout, lse, q_rows, k_rows);
}

Vec pick_rows(const Vec& x, int64_t bh, int64_t n, int64_t row_len, const RowSet& rows) {
  Vec r;
  for (int64_t h = 0; h < bh; ++h) {
    for (int64_t i : rows) {
      const auto at = x.begin() + (h * n + i) * row_len;
      r.insert(r.end(), at, at + row_len);
    }
  }
  return r;
}

}  // namespace kt
