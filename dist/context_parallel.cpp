// Context parallelism, the core: the causal load-balance layout and attention over a sequence
// sharded across a cp communicator (dist/context_parallel.h).
#include "dist/context_parallel.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

// ---- layout -------------------------------------------------------------------------------------

CpLayout CpLayout::make(int64_t seq, int cp, int parts) {
  MESHRT_CHECK(cp >= 1, "context parallelism: cp=" << cp << " must be >= 1");
  MESHRT_CHECK(parts >= 2 && parts % 2 == 0,
               "context parallelism: " << parts
                                       << " chunks per rank: it must be an even number >= 2 (the "
                                          "causal zigzag gives each rank chunks in pairs)");
  const int64_t nc = static_cast<int64_t>(parts) * cp;
  MESHRT_CHECK(seq >= 1 && seq % nc == 0,
               "context parallelism: sequence length "
                   << seq << " is not divisible by " << (parts == 2 ? "2" : std::to_string(parts))
                   << " x cp = " << nc << " (cp=" << cp
                   << "): the causal load-balance layout cuts the sequence into "
                   << (parts == 2 ? "2" : std::to_string(parts))
                   << " x cp equal chunks (rank i holds chunks i and 2cp-1-i"
                   << (parts == 2 ? "" : " of each run of 2 x cp")
                   << "); use a sequence length that is a multiple of " << nc << " or another cp");
  return CpLayout{seq, cp, parts};
}

std::vector<int64_t> CpLayout::chunks(int rank) const {
  MESHRT_CHECK(rank >= 0 && rank < cp,
               "context parallelism: rank " << rank << " is outside cp=" << cp);
  if (!assign.empty()) return assign[static_cast<size_t>(rank)];
  std::vector<int64_t> c;
  const int64_t run = 2 * static_cast<int64_t>(cp);
  for (int64_t j = 0; j < parts / 2; ++j) {
    c.push_back(j * run + rank);
    c.push_back(j * run + run - 1 - rank);
  }
  return c;
}

namespace {
// Longest processing time first with `parts` chunks per rank: `order` (chunks by ascending work)
// taken heaviest first, each to the rank with the least work that still has room (ties: the
// lower rank).
std::vector<std::vector<int64_t>> lpt_assign(int cp, int parts, const std::vector<int64_t>& order,
                                             const std::vector<int64_t>& work) {
  std::vector<std::vector<int64_t>> a(static_cast<size_t>(cp));
  std::vector<int64_t> load(static_cast<size_t>(cp), 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    size_t best = a.size();
    for (size_t r = 0; r < a.size(); ++r)
      if (static_cast<int>(a[r].size()) < parts && (best == a.size() || load[r] < load[best]))
        best = r;
    a[best].push_back(*it);
    load[best] += work[static_cast<size_t>(*it)];
  }
  return a;
}
}  // namespace

CpLayout CpLayout::balanced(int64_t seq, int cp, const std::vector<int64_t>& chunk_work,
                            int parts) {
  CpLayout l = make(seq, cp, parts);
  const int64_t nc = l.num_chunks();
  MESHRT_CHECK(static_cast<int64_t>(chunk_work.size()) == nc,
               "CpLayout::balanced: " << chunk_work.size() << " chunk works for cp=" << cp
                                      << " and " << parts << " chunks per rank, which cut the "
                                      << "sequence into " << nc << " chunks");
  std::vector<int64_t> order(static_cast<size_t>(nc));
  for (int64_t c = 0; c < nc; ++c) order[static_cast<size_t>(c)] = c;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return chunk_work[static_cast<size_t>(a)] < chunk_work[static_cast<size_t>(b)];
  });
  if (parts == 2) {
    for (int64_t i = 0; i < cp; ++i)
      l.assign.push_back({order[static_cast<size_t>(i)], order[static_cast<size_t>(nc - 1 - i)]});
  } else {
    l.assign = lpt_assign(cp, parts, order, chunk_work);
  }
  for (auto& a : l.assign) std::sort(a.begin(), a.end());
  std::sort(l.assign.begin(), l.assign.end());
  // LPT is a heuristic: where it is no better than the standard zigzag, keep that.
  auto heaviest = [&](const CpLayout& x) {
    const std::vector<int64_t> w = cp_rank_work(x, chunk_work);
    return *std::max_element(w.begin(), w.end());
  };
  if (parts > 2 && heaviest(l) >= heaviest(make(seq, cp, parts))) l.assign.clear();
  return l;
}

// ---- packed documents: causal attention work per rank ------------------------------------------

std::vector<int64_t> cp_chunk_work(int64_t seq, int cp, const std::vector<int64_t>& doc_starts,
                                   int parts) {
  const CpLayout l = CpLayout::make(seq, cp, parts);
  for (size_t i = 0; i < doc_starts.size(); ++i)
    MESHRT_CHECK(
        doc_starts[i] >= 0 && doc_starts[i] < seq && (i == 0 || doc_starts[i] > doc_starts[i - 1]),
        "cp_chunk_work: document start "
            << doc_starts[i] << " (entry " << i << ") must be in [0, " << seq
            << ") and after the previous start"
            << (i > 0 ? " " + std::to_string(doc_starts[i - 1]) : std::string()));
  std::vector<int64_t> work(static_cast<size_t>(l.num_chunks()), 0);
  size_t next = 0;
  int64_t start = 0;  // the current document's first position
  for (int64_t p = 0; p < seq; ++p) {
    if (next < doc_starts.size() && doc_starts[next] == p) start = doc_starts[next++];
    work[static_cast<size_t>(p / l.chunk())] += p - start + 1;
  }
  return work;
}

std::vector<int64_t> cp_rank_work(const CpLayout& layout, const std::vector<int64_t>& chunk_work) {
  MESHRT_CHECK(static_cast<int64_t>(chunk_work.size()) == layout.num_chunks(),
               "cp_rank_work: " << chunk_work.size() << " chunk works for cp=" << layout.cp
                                << " and " << layout.parts << " chunks per rank");
  std::vector<int64_t> w(static_cast<size_t>(layout.cp), 0);
  for (int r = 0; r < layout.cp; ++r)
    for (int64_t c : layout.chunks(r))
      w[static_cast<size_t>(r)] += chunk_work[static_cast<size_t>(c)];
  return w;
}

double cp_imbalance(const std::vector<int64_t>& rank_work) {
  int64_t mx = 0, sum = 0;
  for (int64_t w : rank_work) {
    mx = std::max(mx, w);
    sum += w;
  }
  if (sum == 0) return 1.0;
  return static_cast<double>(mx) * static_cast<double>(rank_work.size()) / static_cast<double>(sum);
}

int64_t CpLayout::global_pos(int rank, int64_t local) const {
  MESHRT_CHECK(local >= 0 && local < local_seq(), "context parallelism: local position "
                                                      << local << " is outside the rank's "
                                                      << local_seq() << " tokens");
  const auto c = chunks(rank);
  const int64_t n = chunk();
  return c[static_cast<size_t>(local / n)] * n + local % n;
}

namespace {

void check_seq_dim(const char* what, const CpLayout& layout, const Tensor& full, int seq_dim,
                   const Tensor& shard) {
  MESHRT_CHECK(seq_dim >= 0 && seq_dim < full.ndim() && full.ndim() == shard.ndim(),
               what << ": seq_dim " << seq_dim << " must be a dim of the full tensor " << full.str()
                    << " and of the shard " << shard.str());
  MESHRT_CHECK(full.size(seq_dim) == layout.seq && shard.size(seq_dim) == layout.local_seq(),
               what << ": the full tensor " << full.str() << " must have " << layout.seq
                    << " and the shard " << shard.str() << " " << layout.local_seq()
                    << " entries along dim " << seq_dim << " (cp=" << layout.cp << ")");
}

}  // namespace

void cp_shard(const CpLayout& layout, int rank, const Tensor& full, int seq_dim,
              const Tensor& shard, Stream& stream) {
  check_seq_dim("cp_shard", layout, full, seq_dim, shard);
  const auto c = layout.chunks(rank);
  const int64_t n = layout.chunk();
  for (size_t j = 0; j < c.size(); ++j)
    shard.narrow(seq_dim, static_cast<int64_t>(j) * n, n)
        .copy_(full.narrow(seq_dim, c[j] * n, n), stream);
}

void cp_unshard(const CpLayout& layout, int rank, const Tensor& shard, int seq_dim,
                const Tensor& full, Stream& stream) {
  check_seq_dim("cp_unshard", layout, full, seq_dim, shard);
  const auto c = layout.chunks(rank);
  const int64_t n = layout.chunk();
  for (size_t j = 0; j < c.size(); ++j)
    full.narrow(seq_dim, c[j] * n, n)
        .copy_(shard.narrow(seq_dim, static_cast<int64_t>(j) * n, n), stream);
}

void cp_gather(Communicator& cp, const CpLayout& layout, const Tensor& shard, int seq_dim,
               const Tensor& full, Context& ctx, Stream& stream) {
  check_seq_dim("cp_gather", layout, full, seq_dim, shard);
  MESHRT_CHECK(cp.size() == layout.cp, "cp_gather: the communicator '"
                                           << cp.name() << "' has " << cp.size()
                                           << " ranks but the layout has cp=" << layout.cp);
  std::vector<int64_t> dims{layout.cp};
  for (int d = 0; d < shard.ndim(); ++d) dims.push_back(shard.size(d));
  Tensor src = shard.contiguous(stream);
  Tensor all = ctx.empty(Shape(dims), shard.dtype());
  stream.wait(cp.all_gather(src, all, stream, {stream.record()}));
  for (int r = 0; r < layout.cp; ++r)
    cp_unshard(layout, r, all.select(0, r), seq_dim, full, stream);
}

// ---- exchange names -----------------------------------------------------------------------------

const char* cp_comm_name(CpComm c) { return c == CpComm::Ring ? "ring" : "allgather"; }

CpComm parse_cp_comm(std::string_view s) {
  if (s == "ring") return CpComm::Ring;
  if (s == "allgather") return CpComm::AllGather;
  MESHRT_FAIL("cp exchange '" << s << "' must be ring or allgather");
}

// ---- attention ----------------------------------------------------------------------------------

namespace {

thread_local const std::function<void(const Event&)>* t_exchange_wait = nullptr;

// The compute stream `cs` waits for an exchange (through the CpWaitScope's function if any).
void wait_exchange(Stream& cs, const Event& e) {
  if (t_exchange_wait && e.valid())
    (*t_exchange_wait)(e);
  else
    cs.wait(e);
}

}  // namespace

CpWaitScope::CpWaitScope(std::function<void(const Event&)> wait)
    : wait_(std::move(wait)), prev_(t_exchange_wait) {
  t_exchange_wait = &wait_;
}

CpWaitScope::~CpWaitScope() { t_exchange_wait = prev_; }

namespace {

// A rank's `parts` chunks as one contiguous tensor [parts, batch, heads, chunk(, head_dim)], so
// that each chunk is a contiguous operand of the attention ops.
Tensor to_parts(Context& ctx, Stream& s, const Tensor& x, int64_t parts) {
  const int64_t c = x.size(2) / parts;
  std::vector<int64_t> dims{parts};
  for (int d = 0; d < x.ndim(); ++d) dims.push_back(d == 2 ? c : x.size(d));
  Tensor h = ctx.empty(Shape(dims), x.dtype());
  for (int64_t j = 0; j < parts; ++j) h.select(0, j).copy_(x.narrow(2, j * c, c), s);
  return h;
}

void from_parts(Stream& s, const Tensor& h, const Tensor& x) {
  const int64_t parts = h.size(0), c = x.size(2) / parts;
  for (int64_t j = 0; j < parts; ++j) x.narrow(2, j * c, c).copy_(h.select(0, j), s);
}

// K and V of a shard in one tensor [2 (k, v), parts, batch, heads, chunk, head_dim]: what one
// send, receive or gather entry carries.
Tensor pack_kv(Context& ctx, Stream& s, const Tensor& k, const Tensor& v, int64_t parts) {
  const int64_t c = k.size(2) / parts;
  Tensor p = ctx.empty({2, parts, k.size(0), k.size(1), c, k.size(3)}, k.dtype());
  for (int64_t j = 0; j < parts; ++j) {
    p.select(0, 0).select(0, j).copy_(k.narrow(2, j * c, c), s);
    p.select(0, 1).select(0, j).copy_(v.narrow(2, j * c, c), s);
  }
  return p;
}

Tensor flat(const Tensor& t) { return t.view({t.numel()}); }

// The document ids of doc-masked cp attention, cut into the layout's chunks.
struct CpDocs {
  Tensor chunks;                     // i32 [chunks, batch, chunk]: chunk c's ids, contiguous
  std::vector<int32_t> first, last;  // [chunks x batch]: chunk c's first and last id in row b
  int64_t batch = 0;
  bool defined() const { return chunks.defined(); }
  Tensor of(int64_t chunk) const { return defined() ? chunks.select(0, chunk) : Tensor(); }
  // Whether chunks qc and kc share a document in some row (ids are non-decreasing).
  bool share(int64_t qc, int64_t kc) const {
    for (int64_t b = 0; b < batch; ++b) {
      const auto q = static_cast<size_t>(qc * batch + b), k = static_cast<size_t>(kc * batch + b);
      if (first[k] <= last[q] && first[q] <= last[k]) return true;
    }
    return false;
  }
};

// Validates the whole sequence's document ids (read now) and cuts them into chunks, on the
// host device `dev` (the rank's).
CpDocs cut_docs(const char* op, const CpLayout& L, const Tensor& ids, int64_t batch, Device dev) {
  CpDocs d;
  if (!ids.defined()) return d;
  MESHRT_CHECK(ids.device().is_cpu() && ids.dtype() == DType::i32 && ids.ndim() == 2 &&
                   ids.size(0) == batch && ids.size(1) == L.seq && ids.is_contiguous(),
               op << ": doc_ids " << ids.str() << " must be contiguous i32 [" << batch << ", "
                  << L.seq << "] on the host: the document id of every position of the whole "
                  << "sequence (batch " << batch << ", sequence " << L.seq << " = cp " << L.cp
                  << " x " << L.local_seq() << " tokens per rank)");
  const int32_t* p = ids.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 1; i < L.seq; ++i)
      MESHRT_CHECK(p[b * L.seq + i] >= p[b * L.seq + i - 1],
                   op << ": doc_ids[" << b << ", " << i << "] = " << p[b * L.seq + i]
                      << " follows doc_ids[" << b << ", " << i - 1 << "] = " << p[b * L.seq + i - 1]
                      << ": document ids must be non-decreasing along the sequence (each "
                         "document one run of positions)");
  const int64_t nc = L.num_chunks(), n = L.chunk();
  std::vector<int32_t> buf(static_cast<size_t>(nc * batch * n));
  d.first.resize(static_cast<size_t>(nc * batch));
  d.last.resize(d.first.size());
  d.batch = batch;
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t* src = p + b * L.seq + c * n;
      std::copy(src, src + n, buf.begin() + (c * batch + b) * n);
      d.first[static_cast<size_t>(c * batch + b)] = src[0];
      d.last[static_cast<size_t>(c * batch + b)] = src[n - 1];
    }
  d.chunks = Tensor::from_host_data(buf.data(), {nc, batch, n}, DType::i32, dev);
  return d;
}

// What every step of a rank's cp attention shares.
struct CpRun {
  Communicator& comm;
  Context& ctx;
  CpLayout layout;
  float scale;
  bool causal;
  CpDocs docs;
  int rank() const { return comm.rank(); }
  Stream& cs() { return ctx.compute_stream(); }
  // Whether query chunk qc attends to key chunk kc at all: not wholly in its future (causal) and
  // sharing a document with it (doc-masked).
  bool sees(int64_t qc, int64_t kc) const {
    return (!causal || kc <= qc) && (!docs.defined() || docs.share(qc, kc));
  }
};

struct FwdState {
  Tensor qh, oh, lh;  // query, output and lse parts (one per chunk)
  Tensor po, pl;      // one block's partial
};

// Attends this rank's queries to the K/V shard `kv` of rank `src`, merging into st.oh / st.lh.
void attend_fwd(CpRun& run, int src, const Tensor& kv, FwdState& st) {
  const auto qc = run.layout.chunks(run.rank()), kc = run.layout.chunks(src);
  const int64_t n = run.layout.chunk();
  for (size_t a = 0; a < qc.size(); ++a)
    for (size_t b = 0; b < kc.size(); ++b) {
      if (!run.sees(qc[a], kc[b])) continue;
      ops::attention_block_fwd(run.ctx, run.cs(), st.qh.select(0, a), kv.select(0, 0).select(0, b),
                               kv.select(0, 1).select(0, b), st.po, st.pl, run.scale, run.causal,
                               qc[a] * n, kc[b] * n, run.docs.of(qc[a]), run.docs.of(kc[b]));
      ops::attention_merge(run.ctx, run.cs(), st.oh.select(0, a), st.lh.select(0, a), st.po, st.pl);
    }
}

struct BwdState {
  Tensor qh, oh, gh, lh;  // query, output, output-gradient and lse parts
  Tensor dqh;             // accumulated dq parts
  Tensor pdq, pdk, pdv;   // one block's gradients
};

// The backward of attend_fwd for rank `src`'s shard: adds into st.dqh and into dkv, src's
// accumulated dK/dV (packed like kv).
void attend_bwd(CpRun& run, int src, const Tensor& kv, const Tensor& dkv, BwdState& st) {
  const auto qc = run.layout.chunks(run.rank()), kc = run.layout.chunks(src);
  const int64_t n = run.layout.chunk();
  Context& ctx = run.ctx;
  Stream& s = run.cs();
  for (size_t a = 0; a < qc.size(); ++a)
    for (size_t b = 0; b < kc.size(); ++b) {
      if (!run.sees(qc[a], kc[b])) continue;
      const Tensor dqa = st.dqh.select(0, a), dkb = dkv.select(0, 0).select(0, b),
                   dvb = dkv.select(0, 1).select(0, b);
      ops::attention_block_bwd(ctx, s, st.qh.select(0, a), kv.select(0, 0).select(0, b),
                               kv.select(0, 1).select(0, b), st.oh.select(0, a), st.gh.select(0, a),
                               st.lh.select(0, a), st.pdq, st.pdk, st.pdv, run.scale, run.causal,
                               qc[a] * n, kc[b] * n, run.docs.of(qc[a]), run.docs.of(kc[b]));
      ops::add(ctx, s, dqa, st.pdq, dqa);
      ops::add(ctx, s, dkb, st.pdk, dkb);
      ops::add(ctx, s, dvb, st.pdv, dvb);
    }
}

void add_valid(EventList& l, const Event& e) {
  if (e.valid()) l.push_back(e);
}

// Ring forward: at step s this rank holds rank (rank - s)'s K/V, attends to it while sending it
// on to rank + 1 and receiving the next from rank - 1 (double-buffered, on the side streams).
void ring_fwd(CpRun& run, const Tensor& k, const Tensor& v, FwdState& st) {
  const int P = run.comm.size(), r = run.rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  Stream& ss = run.ctx.stream("cp.send");
  Stream& rs = run.ctx.stream("cp.recv");
  Tensor buf[2] = {pack_kv(run.ctx, run.cs(), k, v, run.layout.parts), {}};
  if (P > 1) buf[1] = run.ctx.empty(buf[0].shape(), buf[0].dtype());
  // compute_prev starts at the buffers' allocation: the first receive must not write them before
  // the compute stream is done with what the allocator reused for them.
  Event ready = run.cs().record(), send_prev, compute_prev = ready;
  for (int s = 0; s < P; ++s) {
    const Tensor& cur = buf[s % 2];
    if (s > 0) wait_exchange(run.cs(), ready);
    Event send_ev, recv_ev;
    if (s + 1 < P) {
      send_ev = run.comm.send(cur, next, ss, {ready});
      EventList after;  // the buffer received into was attended to and sent at step s - 1
      add_valid(after, send_prev);
      add_valid(after, compute_prev);
      recv_ev = run.comm.recv(buf[(s + 1) % 2], prev, rs, after);
    }
    attend_fwd(run, (r - s + P) % P, cur, st);
    compute_prev = run.cs().record();
    if (send_ev.valid()) send_prev = send_ev;  // the last send: waited for at the end
    ready = recv_ev;
  }
  if (send_prev.valid()) wait_exchange(run.cs(), send_prev);
}

// Ring backward: K/V travel as in the forward; the dK/dV accumulated for the shard held travel
// with it (sent once this step's attention is done), and after P steps each shard's dK/dV has
// come back to its owner. Returns this rank's dK/dV, packed like K/V.
Tensor ring_bwd(CpRun& run, const Tensor& k, const Tensor& v, BwdState& st) {
  const int P = run.comm.size(), r = run.rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  Stream& ss = run.ctx.stream("cp.send");
  Stream& rs = run.ctx.stream("cp.recv");
  Tensor kv[2] = {pack_kv(run.ctx, run.cs(), k, v, run.layout.parts), {}};
  Tensor dkv[2] = {run.ctx.empty(kv[0].shape(), kv[0].dtype()), {}};
  ops::fill(run.ctx, run.cs(), dkv[0], 0.0);
  if (P > 1) {
    kv[1] = run.ctx.empty(kv[0].shape(), kv[0].dtype());
    dkv[1] = run.ctx.empty(kv[0].shape(), kv[0].dtype());
  }
  Event kv_ready = run.cs().record(), dkv_ready, kv_send_prev, dkv_send_prev,
        compute_prev = kv_ready;  // as in ring_fwd: the first receives wait for the allocation
  for (int s = 0; s < P; ++s) {
    const Tensor &cur = kv[s % 2], &dcur = dkv[s % 2];
    if (s > 0) {
      wait_exchange(run.cs(), kv_ready);
      wait_exchange(run.cs(), dkv_ready);
    }
    Event kv_send, kv_recv;
    if (s + 1 < P) {
      kv_send = run.comm.send(cur, next, ss, {kv_ready});
      EventList after;
      add_valid(after, kv_send_prev);
      add_valid(after, compute_prev);
      kv_recv = run.comm.recv(kv[(s + 1) % 2], prev, rs, after);
    }
    attend_bwd(run, (r - s + P) % P, cur, dcur, st);
    const Event computed = run.cs().record();
    if (P > 1) {
      const Event dkv_send = run.comm.send(dcur, next, ss, {computed});
      EventList after;
      add_valid(after, dkv_send_prev);
      add_valid(after, compute_prev);
      dkv_ready = run.comm.recv(dkv[(s + 1) % 2], prev, rs, after);
      dkv_send_prev = dkv_send;
    }
    compute_prev = computed;
    if (kv_send.valid()) kv_send_prev = kv_send;  // the last K/V send: waited for at the end
    kv_ready = kv_recv;
  }
  if (P == 1) return dkv[0];
  wait_exchange(run.cs(), dkv_ready);
  wait_exchange(run.cs(), dkv_send_prev);
  if (kv_send_prev.valid()) wait_exchange(run.cs(), kv_send_prev);
  return dkv[P % 2];
}

// Every rank's packed K/V: [P, 2, parts, batch, heads, chunk, head_dim].
Tensor gather_kv(CpRun& run, const Tensor& k, const Tensor& v) {
  Tensor mine = pack_kv(run.ctx, run.cs(), k, v, run.layout.parts);
  std::vector<int64_t> dims{run.comm.size()};
  for (int d = 0; d < mine.ndim(); ++d) dims.push_back(mine.size(d));
  Tensor all = run.ctx.empty(Shape(dims), mine.dtype());
  Stream& rs = run.ctx.stream("cp.recv");
  wait_exchange(run.cs(), run.comm.all_gather(flat(mine), flat(all), rs, {run.cs().record()}));
  return all;
}

void check_cp_attention(const char* op, Communicator& cp, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse) {
  MESHRT_CHECK(q.ndim() == 4 && q.size(2) % 2 == 0,
               op << ": q " << q.str()
                  << " must be this rank's shard [batch, heads, parts x chunk, head_dim] (its "
                     "chunks of the causal load-balance layout, in pairs: an even length)");
  for (const Tensor* t : {&k, &v, &out})
    MESHRT_CHECK(t->shape() == q.shape() && t->dtype() == q.dtype(),
                 op << ": k, v and out must be shaped like q " << q.str() << ", got " << t->str());
  MESHRT_CHECK(lse.dtype() == DType::f32 && lse.ndim() == 3 && lse.size(0) == q.size(0) &&
                   lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
               op << ": lse " << lse.str() << " must be f32 [" << q.size(0) << ", " << q.size(1)
                  << ", " << q.size(2) << "] for q " << q.str());
}

// The layout the shards were cut with: `given`, checked against the communicator and q, or the
// standard one.
CpLayout layout_of(const char* op, Communicator& cp, const Tensor& q, const CpLayout* given) {
  if (given == nullptr) return CpLayout::make(q.size(2) * cp.size(), cp.size());
  MESHRT_CHECK(given->cp == cp.size() && given->local_seq() == q.size(2),
               op << ": the layout (sequence " << given->seq << ", cp=" << given->cp
                  << ") does not hold this call's shards: the communicator '" << cp.name()
                  << "' has " << cp.size() << " ranks and q " << q.str() << " " << q.size(2)
                  << " tokens per rank");
  return *given;
}

}  // namespace

void cp_attention_fwd(Communicator& cp, Context& ctx, CpComm how, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& lse, float softmax_scale,
                      bool causal, const Tensor& doc_ids, const CpLayout* given) {
  check_cp_attention("cp_attention_fwd", cp, q, k, v, out, lse);
  CpRun run{cp, ctx, layout_of("cp_attention_fwd", cp, q, given), softmax_scale, causal, {}};
  run.docs = cut_docs("cp_attention_fwd", run.layout, doc_ids, q.size(0), ctx.device());
  const int64_t parts = run.layout.parts;
  Stream& s = run.cs();
  FwdState st;
  st.qh = to_parts(ctx, s, q, parts);
  st.oh = ctx.empty(st.qh.shape(), q.dtype());
  st.lh = ctx.empty({parts, q.size(0), q.size(1), q.size(2) / parts}, DType::f32);
  st.po = ctx.empty(st.qh.select(0, 0).shape(), q.dtype());
  st.pl = ctx.empty(st.lh.select(0, 0).shape(), DType::f32);
  ops::fill(ctx, s, st.oh, 0.0);
  ops::fill(ctx, s, st.lh, -std::numeric_limits<double>::infinity());
  if (how == CpComm::Ring) {
    ring_fwd(run, k, v, st);
  } else {
    Tensor all = gather_kv(run, k, v);
    for (int src = 0; src < cp.size(); ++src) attend_fwd(run, src, all.select(0, src), st);
  }
  from_parts(s, st.oh, out);
  from_parts(s, st.lh, lse);
}

void cp_attention_bwd(Communicator& cp, Context& ctx, CpComm how, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& dout, const Tensor& lse,
                      const Tensor& dq, const Tensor& dk, const Tensor& dv, float softmax_scale,
                      bool causal, const Tensor& doc_ids, const CpLayout* given) {
  check_cp_attention("cp_attention_bwd", cp, q, k, v, out, lse);
  for (const Tensor* t : {&dout, &dq, &dk, &dv})
    MESHRT_CHECK(t->shape() == q.shape() && t->dtype() == q.dtype(),
                 "cp_attention_bwd: dout, dq, dk and dv must be shaped like q "
                     << q.str() << ", got " << t->str());
  CpRun run{cp, ctx, layout_of("cp_attention_bwd", cp, q, given), softmax_scale, causal, {}};
  run.docs = cut_docs("cp_attention_bwd", run.layout, doc_ids, q.size(0), ctx.device());
  const int64_t parts = run.layout.parts;
  Stream& s = run.cs();
  BwdState st;
  st.qh = to_parts(ctx, s, q, parts);
  st.oh = to_parts(ctx, s, out, parts);
  st.gh = to_parts(ctx, s, dout, parts);
  st.lh = to_parts(ctx, s, lse, parts);
  st.dqh = ctx.empty(st.qh.shape(), q.dtype());
  ops::fill(ctx, s, st.dqh, 0.0);
  st.pdq = ctx.empty(st.qh.select(0, 0).shape(), q.dtype());
  st.pdk = ctx.empty(st.qh.select(0, 0).shape(), q.dtype());
  st.pdv = ctx.empty(st.qh.select(0, 0).shape(), q.dtype());
  Tensor mine;
  if (how == CpComm::Ring) {
    mine = ring_bwd(run, k, v, st);
  } else {
    Tensor all = gather_kv(run, k, v);
    Tensor dall = ctx.empty(all.shape(), all.dtype());
    ops::fill(ctx, s, dall, 0.0);
    for (int src = 0; src < cp.size(); ++src)
      attend_bwd(run, src, all.select(0, src), dall.select(0, src), st);
    mine = ctx.empty(all.select(0, 0).shape(), all.dtype());
    Stream& rs = ctx.stream("cp.recv");
    wait_exchange(s, cp.reduce_scatter(flat(dall), flat(mine), ReduceOp::Sum, rs, {s.record()}));
  }
  from_parts(s, st.dqh, dq);
  from_parts(s, mine.select(0, 0), dk);
  from_parts(s, mine.select(0, 1), dv);
}

}  // namespace meshrt
