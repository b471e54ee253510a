// Host scaled-dot-product attention: blocked with online softmax (flash-attention's algorithm on
// BLAS tiles). Memory per task is O(block * head_dim); no seq x seq matrix is formed.
#include <algorithm>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host/gemm_f32_path.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "kernels/host/reduce.h"
#include "kernels/math.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/error.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

namespace {

constexpr int64_t kBq = 64;  // query rows per block
constexpr int64_t kBk = 64;  // key rows per block (backward)
// Key rows per block of the forward: its two tile products (Q K^T and P V) run as sgemm calls, and
// 64 x 256 tiles amortise OpenBLAS's per-call packing better than 64 x 64 (measured with
// `meshrt bench gemm --no-gemm`, f32, one thread: forward 32 -> 38 GFLOP/s at seq 512 and
// 26 -> 36 at seq 1024). The backward keeps 64: wider key blocks there mask more of each diagonal
// tile (its query blocks start at the key block) and measured slower.
constexpr int64_t kBkFwd = 256;

// c[m, n] (row stride ldc) = alpha op(a) op(b) + beta c in f32: OpenBLAS sgemm, or under
// MESHRT_HOST_F32_GEMM=bf16 oneDNN's matmul with bf16 products (gemm_f32_path.h).
struct TileGemm {
  F32Path path;
  void operator()(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) const {
    const DnnlTile t{m, n, k, a, lda, ta, b, ldb, tb, c, ldc, false, nullptr, alpha, beta, true};
    f32_tile_on(t, path);
  }
};

// Rows [r0, r0 + n) of a [*, d] head as f32: the rows themselves for f32 storage, else
// converted into buf.
template <class T>
const float* rows_f32(const T* head, int64_t r0, int64_t n, int64_t d, float* buf) {
  if constexpr (sizeof(T) == 4) {
    return head + r0 * d;
  } else {
    for (int64_t r = 0; r < n; ++r) load_row(head + (r0 + r) * d, buf + r * d, d);
    return buf;
  }
}

// delta = q_offset - kv_offset: under the causal mask, local query row i sees local key j when
// j <= i + delta (0 for a whole sequence; a block of it at global offsets otherwise).
// q_doc / k_doc: the document ids ([batch, sq] and [batch, sk], non-decreasing per row) of a
// doc-masked block, else null.
struct AttnDims {
  int64_t bh, sq, sk, d;
  int64_t delta = 0;
  int64_t heads = 1;
  const int32_t* q_doc = nullptr;
  const int32_t* k_doc = nullptr;
};

AttnDims dims_of(const Tensor& q, const Tensor& k, int64_t delta = 0) {
  return {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), delta, q.size(1)};
}

// The keys a query row sees: local key indices [lo, hi) (empty when hi <= lo). Under the causal
// and document masks they are one run: a document is a run of positions.
struct KeyRange {
  int64_t lo, hi;
  bool empty() const { return hi <= lo; }
};

KeyRange key_range(const AttnDims& D, bool causal, int64_t head, int64_t i) {
  KeyRange r{0, causal ? std::clamp<int64_t>(i + D.delta + 1, 0, D.sk) : D.sk};
  if (D.q_doc != nullptr) {
    const int64_t b = head / D.heads;
    const int32_t doc = D.q_doc[b * D.sq + i];
    const int32_t* kd = D.k_doc + b * D.sk;
    r.lo = std::max<int64_t>(r.lo, std::lower_bound(kd, kd + D.sk, doc) - kd);
    r.hi = std::min<int64_t>(r.hi, std::upper_bound(kd, kd + D.sk, doc) - kd);
  }
  return r;
}

// The union of rows' ranges: [min lo, max hi) over the non-empty ones ({sk, 0} when all are).
KeyRange span_of(const KeyRange* rr, int64_t rows, int64_t sk) {
  KeyRange u{sk, 0};
  for (int64_t r = 0; r < rows; ++r) {
    if (rr[r].empty()) continue;
    u.lo = std::min(u.lo, rr[r].lo);
    u.hi = std::max(u.hi, rr[r].hi);
  }
  return u;
}

// Whether some row of a tile of keys [k0, k0 + bk) sees only part of it.
bool tile_masked(const KeyRange* rr, int64_t rows, int64_t k0, int64_t bk) {
  for (int64_t r = 0; r < rows; ++r)
    if (rr[r].lo > k0 || rr[r].hi < k0 + bk) return true;
  return false;
}

// Masks a score tile of keys [k0, k0 + bk): row r keeps the columns inside its range rr[r].
void mask_tile(float* s, int64_t bq, int64_t bk, const KeyRange* rr, int64_t k0) {
  for (int64_t r = 0; r < bq; ++r) {
    const int64_t lo = std::clamp<int64_t>(rr[r].lo - k0, 0, bk);
    const int64_t hi = std::clamp<int64_t>(rr[r].hi - k0, lo, bk);
    std::fill(s + r * bk, s + r * bk + lo, -kmath::kInf);
    std::fill(s + r * bk + hi, s + (r + 1) * bk, -kmath::kInf);
  }
}

// Refuses document ids that decrease along a row ([batch, seq], ops.h): the masks take each
// document to be one run of positions.
void check_doc_order(const char* op, const char* name, const int32_t* doc, int64_t batch,
                     int64_t seq) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 1; i < seq; ++i)
      MESHRT_CHECK(doc[b * seq + i] >= doc[b * seq + i - 1],
                   "op " << op << ": " << name << "[" << b << ", " << i
                         << "] = " << doc[b * seq + i] << " follows " << name << "[" << b << ", "
                         << i - 1 << "] = " << doc[b * seq + i - 1]
                         << ": document ids must be non-decreasing along the sequence (each "
                            "document one run of positions); number the documents in order");
}

template <class T>
void attention_fwd_block(const TileGemm& gemm, const AttnDims& D, const T* q, const T* k,
                         const T* v, T* out, float* lse, float scale, bool causal, int64_t head,
                         int64_t i0) {
  const int64_t d = D.d;
  const int64_t bq = std::min(kBq, D.sq - i0);
  const T* qh = q + head * D.sq * d;
  const T* kh = k + head * D.sk * d;
  const T* vh = v + head * D.sk * d;
  float* qs = scratch_f32(0, static_cast<size_t>(kBq * d));
  float* kbuf = scratch_f32(1, static_cast<size_t>(kBkFwd * d));
  float* vbuf = scratch_f32(2, static_cast<size_t>(kBkFwd * d));
  float* s = scratch_f32(3, static_cast<size_t>(kBq * kBkFwd));
  float* o = scratch_f32(4, static_cast<size_t>(kBq * d));
  float* ml = scratch_f32(5, static_cast<size_t>(2 * kBq));
  float* m = ml;
  float* l = ml + kBq;
  // Scale folded into Q: scores come out of sgemm already scaled.
  const auto* qv = row_in(qh + i0 * d, qs, bq * d);  // the block's rows are contiguous
  for (int64_t i = 0; i < bq * d; ++i) qs[i] = scale * load_f32(qv, i);
  std::fill(o, o + bq * d, 0.f);
  std::fill(m, m + bq, -kmath::kInf);
  std::fill(l, l + bq, 0.f);
  KeyRange rr[kBq];
  for (int64_t r = 0; r < bq; ++r) rr[r] = key_range(D, causal, head, i0 + r);
  const KeyRange keys = span_of(rr, bq, D.sk);
  for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += kBkFwd) {
    const int64_t bk = std::min(kBkFwd, keys.hi - k0);
    const float* kb = rows_f32(kh, k0, bk, d, kbuf);
    const float* vb = rows_f32(vh, k0, bk, d, vbuf);
    gemm(false, true, bq, bk, d, 1.0f, qs, d, kb, d, 0.0f, s, bk);
    if (tile_masked(rr, bq, k0, bk)) mask_tile(s, bq, bk, rr, k0);
    for (int64_t r = 0; r < bq; ++r) {
      float* sr = s + r * bk;
      float mt = max_f32(sr, bk);
      float mn = kmath::max_f(m[r], mt);
      float alpha = kmath::exp_diff(m[r], mn);
      for (int64_t c = 0; c < bk; ++c) sr[c] = kmath::exp_diff(sr[c], mn);
      l[r] = l[r] * alpha + sum_f32(sr, bk);
      m[r] = mn;
      if (alpha != 1.f) {
        float* orow = o + r * d;
        for (int64_t j = 0; j < d; ++j) orow[j] *= alpha;
      }
    }
    gemm(false, false, bq, d, bk, 1.0f, s, bk, vb, d, 1.0f, o, d);
  }
  T* oh = out + head * D.sq * d;
  float* lh = lse + head * D.sq;
  auto* ov = row_out(oh + i0 * d, o);  // o itself where the view is a buffer
  for (int64_t r = 0; r < bq; ++r) {
    float inv = l[r] > 0.f ? 1.0f / l[r] : 0.f;
    for (int64_t j = 0; j < d; ++j) store_f32(ov, r * d + j, o[r * d + j] * inv);
    lh[i0 + r] = kmath::softmax_lse(kmath::SoftmaxState{m[r], l[r]});
  }
  row_commit(oh + i0 * d, ov, bq * d);
}

// Whole head [rows, d] as f32 (a view for f32 storage, else converted into buf).
template <class T>
const float* head_f32(const T* p, int64_t rows, int64_t d, std::vector<float>& buf) {
  if constexpr (sizeof(T) == 4) {
    return p;
  } else {
    buf.resize(static_cast<size_t>(rows * d));
    load_row(p, buf.data(), rows * d);
    return buf.data();
  }
}

template <class T>
void attention_bwd_head(const TileGemm& gemm, const AttnDims& D, const T* q, const T* k, const T* v,
                        const T* out, const T* dout, const float* lse, T* dq, T* dk, T* dv,
                        float scale, bool causal, int64_t head) {
  const int64_t d = D.d, sq = D.sq, sk = D.sk;
  std::vector<float> qb, kb, vb, ob, gb;
  const float* Q = head_f32(q + head * sq * d, sq, d, qb);
  const float* K = head_f32(k + head * sk * d, sk, d, kb);
  const float* V = head_f32(v + head * sk * d, sk, d, vb);
  const float* O = head_f32(out + head * sq * d, sq, d, ob);
  const float* dO = head_f32(dout + head * sq * d, sq, d, gb);
  const float* L = lse + head * sq;
  // D_i = rowsum(dO_i * O_i): the softmax-backward correction, once per query row.
  std::vector<float> Di(static_cast<size_t>(sq));
  for (int64_t i = 0; i < sq; ++i) Di[static_cast<size_t>(i)] = dot_f32(dO + i * d, O + i * d, d);
  std::vector<float> dQ(static_cast<size_t>(sq * d), 0.f);
  std::vector<float> dK(static_cast<size_t>(kBk * d)), dV(static_cast<size_t>(kBk * d));
  std::vector<float> P(static_cast<size_t>(kBq * kBk)), dP(static_cast<size_t>(kBq * kBk));
  // Each query row's keys, and each query block's union of them (a block none of whose rows sees
  // a key tile is skipped).
  std::vector<KeyRange> R(static_cast<size_t>(sq)), spans;
  for (int64_t i = 0; i < sq; ++i) R[static_cast<size_t>(i)] = key_range(D, causal, head, i);
  for (int64_t i0 = 0; i0 < sq; i0 += kBq)
    spans.push_back(span_of(R.data() + i0, std::min(kBq, sq - i0), sk));
  for (int64_t k0 = 0; k0 < sk; k0 += kBk) {
    const int64_t bk = std::min(kBk, sk - k0);
    const float* Kj = K + k0 * d;
    const float* Vj = V + k0 * d;
    std::fill(dK.begin(), dK.end(), 0.f);
    std::fill(dV.begin(), dV.end(), 0.f);
    for (int64_t i0 = 0; i0 < sq; i0 += kBq) {
      const KeyRange& span = spans[static_cast<size_t>(i0 / kBq)];
      if (span.hi <= k0 || span.lo >= k0 + bk) continue;  // no row sees these keys
      const int64_t bq = std::min(kBq, sq - i0);
      const KeyRange* rr = R.data() + i0;
      const float* Qi = Q + i0 * d;
      const float* dOi = dO + i0 * d;
      float* p = P.data();
      float* dp = dP.data();
      gemm(false, true, bq, bk, d, scale, Qi, d, Kj, d, 0.0f, p, bk);
      if (tile_masked(rr, bq, k0, bk)) mask_tile(p, bq, bk, rr, k0);
      for (int64_t r = 0; r < bq; ++r) {
        float lr = L[i0 + r];
        float* pr = p + r * bk;
        for (int64_t c = 0; c < bk; ++c) pr[c] = kmath::exp_diff(pr[c], lr);
      }
      // dV_j += P^T dO_i
      gemm(true, false, bk, d, bq, 1.0f, p, bk, dOi, d, 1.0f, dV.data(), d);
      // dP = dO_i V_j^T
      gemm(false, true, bq, bk, d, 1.0f, dOi, d, Vj, d, 0.0f, dp, bk);
      // dS = P * (dP - D_i), stored in dp
      for (int64_t r = 0; r < bq; ++r) {
        float di = Di[static_cast<size_t>(i0 + r)];
        float* dpr = dp + r * bk;
        const float* pr = p + r * bk;
        for (int64_t c = 0; c < bk; ++c) dpr[c] = pr[c] * (dpr[c] - di);
      }
      // dK_j += scale dS^T Q_i ; dQ_i += scale dS K_j
      gemm(true, false, bk, d, bq, scale, dp, bk, Qi, d, 1.0f, dK.data(), d);
      gemm(false, false, bq, d, bk, scale, dp, bk, Kj, d, 1.0f, dQ.data() + i0 * d, d);
    }
    store_row(dk + head * sk * d + k0 * d, dK.data(), bk * d);
    store_row(dv + head * sk * d + k0 * d, dV.data(), bk * d);
  }
  store_row(dq + head * sq * d, dQ.data(), sq * d);
}

// Enqueues the forward of q over k / v with local-to-global offset difference delta.
// The document ids of a doc-masked block (undefined tensors for none).
struct DocIds {
  Tensor q, k;
};

// D with the block's document ids, checked for order (the work of op `op` runs now).
AttnDims with_docs(AttnDims D, const char* op, const DocIds& doc) {
  if (!doc.q.defined()) return D;
  D.q_doc = doc.q.data<int32_t>();
  D.k_doc = doc.k.data<int32_t>();
  check_doc_order(op, "q_doc", D.q_doc, doc.q.size(0), D.sq);
  check_doc_order(op, "k_doc", D.k_doc, doc.k.size(0), D.sk);
  return D;
}

DocIds stream_docs(Stream& s, const Tensor& q_doc, const Tensor& k_doc) {
  if (!q_doc.defined()) return {};
  return {q_doc.stream_ref(s), k_doc.stream_ref(s)};
}

void enqueue_fwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, const Tensor& lse, float scale, bool causal, int64_t delta,
                 const DocIds& docs = {}) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, q = q.stream_ref(s), k = k.stream_ref(s), v = v.stream_ref(s),
             out = out.stream_ref(s), lse = lse.stream_ref(s), scale, causal, delta,
             doc = stream_docs(s, docs.q, docs.k)] {
    ensure_blas_single_threaded();
    // bf16 products under MESHRT_HOST_F32_GEMM=bf16: the forward's 64 x 256 tiles take oneDNN's
    // AMX kernels (1.7x the forward on an AMX Xeon).
    const TileGemm gemm{f32_bf16_math() ? F32Path::onednn_bf16 : F32Path::openblas};
    const AttnDims D = with_docs(dims_of(q, k, delta), "attention_block_fwd", doc);
    const int64_t qblocks = (D.sq + kBq - 1) / kBq;
    dispatch_float(q.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pq = q.data<T>();
      const T* pk = k.data<T>();
      const T* pv = v.data<T>();
      T* po = out.data<T>();
      float* pl = lse.data<float>();
      tp->run(D.bh * qblocks, [&](int64_t t) {
        int64_t head = t / qblocks;
        int64_t i0 = (t % qblocks) * kBq;
        attention_fwd_block<T>(gemm, D, pq, pk, pv, po, pl, scale, causal, head, i0);
      });
    });
  });
}

void enqueue_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                 const Tensor& dk, const Tensor& dv, float scale, bool causal, int64_t delta,
                 const DocIds& docs = {}) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, q = q.stream_ref(s), k = k.stream_ref(s), v = v.stream_ref(s),
             out = out.stream_ref(s), dout = dout.stream_ref(s), lse = lse.stream_ref(s),
             dq = dq.stream_ref(s), dk = dk.stream_ref(s), dv = dv.stream_ref(s), scale, causal,
             delta, doc = stream_docs(s, docs.q, docs.k)] {
    ensure_blas_single_threaded();
    // OpenBLAS in every mode: the backward's 64 x 64 tiles measured 5% slower on oneDNN with bf16
    // products.
    const TileGemm gemm{F32Path::openblas};
    const AttnDims D = with_docs(dims_of(q, k, delta), "attention_block_bwd", doc);
    dispatch_float(q.dtype(), [&](auto tag) {
      using T = decltype(tag);
      tp->run(D.bh, [&](int64_t head) {
        attention_bwd_head<T>(gemm, D, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                              dout.data<T>(), lse.data<float>(), dq.data<T>(), dk.data<T>(),
                              dv.data<T>(), scale, causal, head);
      });
    });
  });
}

// Rows [r0, r1) of the merge: out / lse become the log-sum-exp weighted sum of both partials.
template <class T>
void merge_rows(T* out, float* lse, const T* pout, const float* plse, int64_t d, int64_t r0,
                int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float a = lse[r], b = plse[r];
    const float m = kmath::max_f(a, b);
    const float wa = kmath::exp_diff(a, m), wb = kmath::exp_diff(b, m);
    const float l = wa + wb;  // 0 only when both sides are empty
    const float inv = l > 0.f ? 1.0f / l : 0.f;
    for (int64_t j = 0; j < d; ++j) {
      const float o = load_f32(out + r * d, j) * wa + load_f32(pout + r * d, j) * wb;
      store_f32(out + r * d, j, o * inv);
    }
    lse[r] = kmath::softmax_lse(kmath::SoftmaxState{m, l});
  }
}

}  // namespace

void attention_fwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, float scale, bool causal) {
  enqueue_fwd(ctx, s, q, k, v, out, lse, scale, causal, 0);
}

void attention_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv, float scale, bool causal) {
  enqueue_bwd(ctx, s, q, k, v, out, dout, lse, dq, dk, dv, scale, causal, 0);
}

void attention_block_fwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, float scale, bool causal,
                         int64_t q_offset, int64_t kv_offset, const Tensor& q_doc,
                         const Tensor& k_doc) {
  enqueue_fwd(ctx, s, q, k, v, out, lse, scale, causal, q_offset - kv_offset, {q_doc, k_doc});
}

void attention_block_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv, float scale, bool causal,
                         int64_t q_offset, int64_t kv_offset, const Tensor& q_doc,
                         const Tensor& k_doc) {
  enqueue_bwd(ctx, s, q, k, v, out, dout, lse, dq, dk, dv, scale, causal, q_offset - kv_offset,
              {q_doc, k_doc});
}

void attention_merge(Context& ctx, Stream& s, const Tensor& out, const Tensor& lse,
                     const Tensor& part_out, const Tensor& part_lse) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, out = out.stream_ref(s), lse = lse.stream_ref(s), pout = part_out.stream_ref(s),
             plse = part_lse.stream_ref(s)] {
    const int64_t rows = lse.numel(), d = out.size(-1);
    constexpr int64_t kRowsPerTask = 64;
    const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
    dispatch_float(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      tp->run(tasks, [&](int64_t t) {
        merge_rows<T>(out.data<T>(), lse.data<float>(), pout.data<T>(), plse.data<float>(), d,
                      t * kRowsPerTask, std::min(rows, (t + 1) * kRowsPerTask));
      });
    });
  });
}

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
