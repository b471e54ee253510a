#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "dist/style.h"
#include "model/linear.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "train/optimizer.h"

namespace meshrt::plan {

namespace {

double ceil_div(double n, int parts) { return std::ceil(n / parts); }

}  // namespace

static_assert(static_cast<int>(CommOp::AllReduce) == 0 &&
                  static_cast<int>(CommOp::AllGather) == 1 &&
                  static_cast<int>(CommOp::ReduceScatter) == 2,
              "the link tables list all_reduce, all_gather and reduce_scatter first");

int link_index(CommOp op) {
  const int i = static_cast<int>(op);
  MESHRT_CHECK(i >= 0 && i < kLinkOps, "planner: no link figures for " << comm_op_name(op)
                                                                       << " (only all_reduce, "
                                                                          "all_gather and "
                                                                          "reduce_scatter)");
  return i;
}

double ClusterSpec::gemm_efficiency(double flops) const {
  if (gemm_eff.empty()) return 1.0;
  if (flops <= gemm_eff.front().first) return gemm_eff.front().second;
  if (flops >= gemm_eff.back().first) return gemm_eff.back().second;
  for (size_t i = 1; i < gemm_eff.size(); ++i) {
    const auto& [x1, y1] = gemm_eff[i];
    if (flops > x1) continue;
    const auto& [x0, y0] = gemm_eff[i - 1];
    const double t = (std::log(flops) - std::log(x0)) / (std::log(x1) - std::log(x0));
    return y0 + t * (y1 - y0);
  }
  return gemm_eff.back().second;
}

double ClusterSpec::gemm_seconds(double m, double n, double k) const {
  const double f = 2 * m * n * k;
  if (f <= 0) return 0;
  return f / (peak_tflops * 1e12 * gemm_efficiency(f));
}

double ClusterSpec::p2p_seconds(double bytes, bool inter_node) const {
  const LinkSpec& l = (inter_node ? inter : intra)[link_index(CommOp::AllGather)];
  return l.latency_us * 1e-6 + bytes / (l.busbw_gbps * 1e9);
}

double ClusterSpec::collective_seconds(const Collective& c, bool inter_node, int per_node) const {
  if (c.group <= 1) return 0;
  const int op = link_index(c.op);
  const LinkSpec& l = (inter_node ? inter : intra)[op];
  double bw = l.busbw_gbps;
  if (inter_node) bw = std::min(intra[op].busbw_gbps, bw * std::max(1, per_node));
  const double n = c.group;
  const double factor = c.op == CommOp::AllReduce ? 2 * (n - 1) / n : (n - 1) / n;
  return l.latency_us * 1e-6 + c.bytes * factor / (bw * 1e9);
}

void ClusterSpec::select_dtype(const std::string& dtype) {
  auto it = peaks.find(dtype);
  if (it == peaks.end() || !(it->second > 0)) {
    std::string have;
    for (const auto& [k, v] : peaks)
      if (v > 0) have += (have.empty() ? "" : ", ") + k;
    MESHRT_FAIL("cluster " << name << " has no peak FLOP/s for --dtype " << dtype
                           << " (it has: " << (have.empty() ? "none" : have)
                           << "); choose one of those for --dtype, or add " << dtype
                           << " to the cluster file's \"peak_tflops\"");
  }
  peak_tflops = it->second;
}

// ---- The structure of one micro-batch ---------------------------------------------------------

namespace {

// The streams of one rank: compute, and one communication stream per mesh dim (tp, dp, cp), as
// CommScheduler runs them: a collective starts when the compute stream reaches its issue point
// and its dim's stream is free; a wait moves the compute clock to the collective's end.
class Sim {
 public:
  Sim(const ClusterSpec& cl, bool inter_dp, int dp_per_node, Overlap ov, bool inter_cp = false)
      : cl_(cl), inter_dp_(inter_dp), dp_per_node_(dp_per_node), ov_(ov), inter_cp_(inter_cp) {}

  void compute(double s) {
    t_ += s;
    r.compute_s += s;
  }
  int issue(const Collective& c) {
    const Dim dim = c.cp ? Dim::Cp : c.dp ? Dim::Dp : Dim::Tp;
    double& free = free_[static_cast<int>(dim)];
    const double d = dim == Dim::Cp ? (c.op == CommOp::Send ? cl_.p2p_seconds(c.bytes, inter_cp_)
                                                            : cl_.collective_seconds(c, inter_cp_))
                                    : cl_.collective_seconds(c, c.dp && inter_dp_, dp_per_node_);
    const double start = std::max(t_, free);
    free = start + d;
    evs_.push_back({start, free, dim, false});
    if (dim == Dim::Cp) {
      r.cp_comm_s += d;
      r.cp_bytes += c.bytes;
      ++r.cp_count;
    } else {
      (c.dp ? r.dp_comm_s : r.tp_comm_s) += d;
      (c.dp ? r.dp_bytes : r.tp_bytes) += c.bytes;
      ++(c.dp ? r.dp_count : r.tp_count);
    }
    log.push_back(c);
    const int id = static_cast<int>(evs_.size()) - 1;
    // Overlap::None (and dp buckets under it): the compute stream waits at once. The cp exchange
    // runs on its own streams whatever --overlap says (dist/context_parallel.cpp); its caller
    // waits where the attention needs the data.
    if (ov_ == Overlap::None && dim != Dim::Cp) wait(id);
    return id;
  }
  void wait(int id) {
    Ev& e = evs_[static_cast<size_t>(id)];
    if (e.waited) return;
    e.waited = true;
    // The part of the collective that ran under compute: hidden only by overlap_eff (host ranks
    // share their cores with the communication threads).
    const double hidden = std::max(0.0, std::min(e.end, t_) - e.start);
    const double slow = (1 - cl_.overlap_eff) * hidden;
    t_ += slow;
    r.compute_s += slow;
    if (e.end > t_) {
      (e.dim == Dim::Cp   ? r.cp_exposed_s
       : e.dim == Dim::Dp ? r.dp_exposed_s
                          : r.tp_exposed_s) += e.end - t_;
      t_ = e.end;
    }
  }
  void wait_all_dp() {
    for (size_t i = 0; i < evs_.size(); ++i)
      if (evs_[i].dim == Dim::Dp) wait(static_cast<int>(i));
  }
  double now() const { return t_; }
  Prediction r;
  std::vector<Collective> log;  // every collective issued, in order

 private:
  enum class Dim { Tp, Dp, Cp };
  struct Ev {
    double start, end;
    Dim dim;
    bool waited;
  };
  const ClusterSpec& cl_;
  bool inter_dp_;
  int dp_per_node_;
  Overlap ov_;
  bool inter_cp_;
  double t_ = 0;
  double free_[3] = {0, 0, 0};  // each dim's stream, by Dim
  std::vector<Ev> evs_;
};

// Issues into a Sim, or only records the collectives (counting mode).
struct Shape {
  double T = 0;   // tokens per replica per micro-batch (micro_batch x seq)
  double Tl = 0;  // tokens held between blocks (T / tp under sequence parallel)
  double h = 0, f = 0, es = 0;
  int64_t tokens = 0, hidden = 0, ffn = 0;  // T, h and f as the description takes them
  int tp = 1;
  bool sp = false;    // sequence parallel and tp > 1
  bool comm = false;  // tp > 1
  int cp = 1;         // T is this cp rank's share of the sequence: micro_batch x seq / cp
  CpComm cp_comm = CpComm::Ring;
  double imbalance = 1;  // causal_imbalance of the cp layout
};

class Block {
 public:
  Block(Sim& sim, const ClusterSpec& cl, const Shape& s, Overlap ov)
      : sim_(sim), cl_(cl), s_(s), ov_(ov) {}

  void ew(double bytes) { sim_.compute(bytes / (cl_.mem_bw_gbps * 1e9)); }
  void gemm(const GemmShape& g) {
    sim_.compute(cl_.gemm_seconds(static_cast<double>(g.m), static_cast<double>(g.n),
                                  static_cast<double>(g.k)));
  }
  int coll(CommOp op, double bytes) { return sim_.issue({op, false, bytes, s_.tp}); }
  // The tp collective of redistribution `r` (dist/parallel.h) over a full-sequence activation of
  // `bytes`, as redistribute() issues it (-1: none, or tp = 1).
  int redist(const Redistribution& r, double bytes) {
    if (!s_.comm) return -1;
    switch (r.kind()) {
      case RedistKind::AllGather:
        return coll(CommOp::AllGather, bytes);
      case RedistKind::ReduceScatter:
        return coll(CommOp::ReduceScatter, bytes);
      case RedistKind::AllReduce:
        return coll(CommOp::AllReduce, bytes);
      case RedistKind::Copy:
        break;
    }
    return -1;
  }
  void wait(int id) {
    if (id >= 0) sim_.wait(id);
  }
  // The linear's GEMMs on this rank (model/block_desc.h), over the micro-batch's full sequence.
  LinearGemms gemms(const LinearDesc& l, int64_t rows) const {
    return linear_gemms(l, rows, s_.tp);
  }
  // Bytes of the linear's full-sequence input and output on this rank.
  double in_bytes(const LinearDesc& l) const { return s_.T * l.in_local(s_.tp) * s_.es; }
  double out_bytes(const LinearDesc& l) const { return s_.T * l.out_local(s_.tp) * s_.es; }

  // A linear's forward as model/linear.cpp runs it, its collectives those of the linear's parallel
  // style (dist/style.h): the input redistributed before the GEMM, the output after it; chunked
  // overlap splits a gathered input or a reduce-scattered output into tp pieces.
  void linear_fwd(const LinearDesc& l) { linear_fwd(l, linear_style(l, s_.sp)); }
  void linear_fwd(const LinearDesc& l, const ParallelStyle& st) {
    const Redistribution rin = st.in(), rout = st.out();
    const bool chunked = s_.comm && ov_ == Overlap::Chunked;
    const GemmShape piece = gemms(l, s_.tokens / (s_.tp * s_.tp)).fwd;
    std::vector<int> ids;
    if (chunked && !rin.is_identity()) {
      for (int c = 0; c < s_.tp; ++c) ids.push_back(redist(rin, in_bytes(l) / s_.tp));
      for (int c = 0; c < s_.tp; ++c) {
        wait(ids[static_cast<size_t>(c)]);
        for (int j = 0; j < s_.tp; ++j) gemm(piece);
      }
      return;
    }
    if (chunked && !rout.is_identity() && rout.to.is_shard()) {
      for (int c = 0; c < s_.tp; ++c) {
        for (int j = 0; j < s_.tp; ++j) gemm(piece);
        ids.push_back(redist(rout, out_bytes(l) / s_.tp));
      }
      for (int id : ids) wait(id);
      return;
    }
    if (s_.comm && forward_own_shard_first(st, ov_)) {
      // Own sequence shard first, while the all-gather runs (Linear::gemm_local_first).
      const int id = redist(rin, in_bytes(l));
      gemm_local_first(gemms(l, s_.tokens / s_.tp).fwd, id);
      return;
    }
    if (s_.comm && forward_peer_rows_first(st, ov_)) {
      // The other ranks' rows first, exchanged while the own rows compute, then the rank-order
      // sum (Linear::gemm_peer_rows_first); the exchange moves the reduce-scatter's bytes and is
      // costed as one.
      const GemmShape piece = gemms(l, s_.tokens / s_.tp).fwd;
      for (int j = 1; j < s_.tp; ++j) gemm(piece);
      const int id = redist(rout, out_bytes(l));
      gemm(piece);
      wait(id);
      ew((s_.tp + 1) * s_.Tl * l.out_local(s_.tp) * s_.es);
      return;
    }
    wait(redist(rin, in_bytes(l)));
    gemm(gemms(l, s_.tokens).fwd);
    wait(redist(rout, out_bytes(l)));
  }
  // tp GEMMs of one sequence shard each: this rank's own before collective `id` completes.
  void gemm_local_first(const GemmShape& piece, int id) {
    gemm(piece);
    wait(id);
    for (int j = 1; j < s_.tp; ++j) gemm(piece);
  }
  // Its backward (Megatron's order): the output gradient redistributed back, the input re-gathered
  // while dgrad runs, dgrad's redistribution while wgrad runs. Returns the input gradient's
  // collective, which the block waits for (-1: none).
  int linear_bwd(const LinearDesc& l) { return linear_bwd(l, linear_style(l, s_.sp)); }
  int linear_bwd(const LinearDesc& l, const ParallelStyle& st) {
    const Redistribution rin = st.in(), rout = st.out();
    const LinearGemms g = gemms(l, s_.tokens);
    const Redistribution gout = rout.grad();
    // Async and chunked: the dgrad rows of the own dy shard run while dy is gathered.
    const bool split = s_.comm && dgrad_own_shard_first(st, ov_);
    const int dy = redist(gout, out_bytes(l));
    if (!split) wait(dy);
    const int regather = redist(rin, in_bytes(l));
    if (split)
      gemm_local_first(gemms(l, s_.tokens / s_.tp).dgrad, dy);
    else
      gemm(g.dgrad);
    const int dx = redist(rin.grad(), in_bytes(l));
    wait(regather);
    gemm(g.wgrad);
    if (g.has_bias_gemm) gemm(g.bias);
    return dx;
  }

  void norm_fwd() { ew(2 * s_.Tl * s_.h * s_.es); }
  // `deferred`: inside the block stack, whose backward defers the gradient writes
  // (CommScheduler::GradDeferral): the all-reduce is waited for at settle_grads, not here.
  void norm_bwd(bool deferred = false) {
    ew(3 * s_.Tl * s_.h * s_.es);
    // On sequence shards the norm's gain and bias gradients are partial sums, all-reduced over tp
    // (the style's partial_param_grads) in one buffer.
    if (sequence_parallel_norm(s_.sp).partial_param_grads) {
      const int id = coll(CommOp::AllReduce, 2 * s_.h * s_.es);
      if (deferred && s_.comm)
        pending_grads_ = id;
      else
        sim_.wait(id);
    }
  }
  // The compute stream waits for the deferred norm-gradient all-reduces (the last covers the
  // earlier ones: the tp stream runs them in order).
  void settle_grads() {
    if (pending_grads_ >= 0) sim_.wait(pending_grads_);
    pending_grads_ = -1;
  }
  void residual() { ew(3 * s_.Tl * s_.h * s_.es); }

  // One layer's K and V shard on this rank, as cp's exchange moves them.
  double kv_bytes() const { return 2 * s_.T * s_.h / s_.tp * s_.es; }
  int cp_issue(CommOp op, double bytes) { return sim_.issue({op, false, bytes, s_.cp, true}); }
  // The attention kernels' `secs` of compute on this rank (its queries against the whole
  // sequence), with cp's K/V exchange (dist/context_parallel.cpp). allgather: every rank's K/V
  // gathered first, exposed; the backward gathers again and reduce-scatters dK/dV to their
  // owners. ring: cp steps, each attending to the shard held while the next one travels on (its
  // wait exposes only what the transfer takes beyond the step's compute); the backward also sends
  // the dK/dV accumulated for the shard held on, the last step's back to its owner.
  void cp_attention(double secs, bool bwd) {
    if (s_.cp == 1) {
      sim_.compute(secs);
      return;
    }
    if (s_.cp_comm == CpComm::AllGather) {
      wait(cp_issue(CommOp::AllGather, s_.cp * kv_bytes()));
      sim_.compute(secs);
      if (bwd) wait(cp_issue(CommOp::ReduceScatter, s_.cp * kv_bytes()));
      return;
    }
    int dkv = -1;
    for (int step = 0; step < s_.cp; ++step) {
      const int kv = step + 1 < s_.cp ? cp_issue(CommOp::Send, kv_bytes()) : -1;
      sim_.compute(secs / s_.cp);
      if (bwd) {
        wait(dkv);  // the previous step's dK/dV arrived: this step's are added to it
        dkv = cp_issue(CommOp::Send, kv_bytes());
      }
      wait(kv);
    }
    wait(dkv);
  }

  void attention_fwd(double attn_flops) {
    norm_fwd();
    linear_fwd(attn_[0]);
    ew(6 * s_.T * s_.h / s_.tp * s_.es);  // q, k, v to [b, heads, s, d]
    cp_attention(attn_flops / (cl_.peak_tflops * 1e12 * cl_.attention_eff), false);
    ew(2 * s_.T * s_.h / s_.tp * s_.es);  // o back to [s, b, hidden]
    linear_fwd(attn_[1]);
    residual();
  }
  void attention_bwd(double attn_flops) {
    wait(linear_bwd(attn_[1]));
    ew(2 * s_.T * s_.h / s_.tp * s_.es);
    // Backward of the fused kernel: twice the forward's model FLOPs (and the recomputed scores).
    cp_attention(2 * attn_flops / (cl_.peak_tflops * 1e12 * cl_.attention_bwd_eff()), true);
    ew(6 * s_.T * s_.h / s_.tp * s_.es);
    wait(linear_bwd(attn_[0]));
    norm_bwd(/*deferred=*/true);
    residual();
  }
  void mlp_fwd() {
    norm_fwd();
    linear_fwd(mlp_[0]);
    ew(2 * s_.T * ceil_div(s_.f, s_.tp) * s_.es);  // bias + GeLU
    linear_fwd(mlp_[1]);
    residual();
  }
  void mlp_bwd() {
    wait(linear_bwd(mlp_[1]));
    ew(3 * s_.T * ceil_div(s_.f, s_.tp) * s_.es);  // GeLU backward (+ its bias gradient)
    wait(linear_bwd(mlp_[0]));
    norm_bwd(/*deferred=*/true);
    residual();
  }

 private:
  Sim& sim_;
  const ClusterSpec& cl_;
  Shape s_;
  int pending_grads_ = -1;
  Overlap ov_;
  // The pieces' linears (qkv, proj; fc1, fc2).
  std::vector<LinearDesc> attn_ = piece_linears(PieceKind::Attention, s_.hidden, s_.ffn);
  std::vector<LinearDesc> mlp_ = piece_linears(PieceKind::Mlp, s_.hidden, s_.ffn);
};

Shape shape_of(const ModelSpec& m, const PlanConfig& c) {
  Shape s;
  s.tp = c.tp;
  s.comm = c.tp > 1;
  s.sp = c.sp && c.tp > 1;
  s.cp = c.cp;
  s.cp_comm = c.cp_comm;
  s.imbalance = c.cp > 1 ? causal_imbalance(m.seq, c.cp) : 1.0;
  const int64_t local_seq = m.seq / c.cp;
  s.T = static_cast<double>(c.micro_batch) * static_cast<double>(local_seq);
  s.Tl = s.sp ? s.T / c.tp : s.T;
  s.tokens = c.micro_batch * local_seq;
  s.hidden = m.hidden;
  s.ffn = m.ffn;
  s.h = static_cast<double>(m.hidden);
  s.f = static_cast<double>(m.ffn);
  s.es = static_cast<double>(dtype_size(m.dtype));
  return s;
}

// Parameters of one piece (attention or MLP block) in forward order, local element counts on tp
// rank 0 (the largest shard when tp does not divide): the description's.
std::vector<double> piece_params(const ModelSpec& m, int tp, bool attention) {
  std::vector<double> out;
  for (int64_t n :
       piece_param_counts(attention ? PieceKind::Attention : PieceKind::Mlp, m.hidden, m.ffn, tp))
    out.push_back(static_cast<double>(n));
  return out;
}

struct Piece {
  bool attention = false;
  int layer = 0;
};

std::vector<Piece> pieces(const ModelSpec& m) {
  std::vector<Piece> ps;
  for (int l = 0; l < m.layers; ++l)
    for (PieceKind p : layer_pieces(m.kind)) ps.push_back({p == PieceKind::Attention, l});
  return ps;
}

// The dp buckets: (bytes, index of the piece after whose backward the bucket launches). Pieces are
// numbered in forward order; the embedding is piece -1, the LM head piece P.
struct BucketPlan {
  std::vector<double> bytes;
  std::vector<int> launch_after;  // piece index; launches after that piece's backward
};

// Every local parameter in forward order: (bytes, piece).
std::vector<std::pair<double, int>> local_params(const ModelSpec& m, const PlanConfig& c) {
  const double es = static_cast<double>(dtype_size(m.dtype));
  const std::vector<Piece> ps = pieces(m);
  std::vector<std::pair<double, int>> params;  // (bytes, piece), forward order
  const double V = static_cast<double>(m.vocab), h = static_cast<double>(m.hidden);
  if (m.vocab > 0) params.push_back({ceil_div(V, c.tp) * h * es, -1});
  for (size_t i = 0; i < ps.size(); ++i)
    for (double n : piece_params(m, c.tp, ps[i].attention))
      params.push_back({n * es, static_cast<int>(i)});
  if (m.vocab > 0) {
    params.push_back({h * es, static_cast<int>(ps.size())});
    params.push_back({h * es, static_cast<int>(ps.size())});
    params.push_back({h * ceil_div(V, c.tp) * es, static_cast<int>(ps.size())});
  }
  return params;
}

BucketPlan buckets(const ModelSpec& m, const PlanConfig& c) {
  const double cap = c.bucket_mb * 1024.0 * 1024.0;
  const std::vector<std::pair<double, int>> params = local_params(m, c);
  BucketPlan b;
  double cur = 0;
  int first_piece = 0;
  bool open = false;
  for (size_t k = params.size(); k-- > 0;) {
    const auto [bytes, piece] = params[k];
    // ZeRO 3's buckets follow piece boundaries (GradSync: a piece gathers its own buckets).
    if (open && (cur + bytes > cap || (c.zero == 3 && piece != first_piece))) {
      b.bytes.push_back(cur);
      b.launch_after.push_back(first_piece);
      open = false;
      cur = 0;
    }
    cur += bytes;
    first_piece = piece;  // the earliest (in forward order) piece so far: the last one ready
    open = true;
  }
  if (open) {
    b.bytes.push_back(cur);
    b.launch_after.push_back(first_piece);
  }
  return b;
}

// The group the gradients are reduced over (and ZeRO shards over): dp x cp.
int grad_group(const PlanConfig& c) { return c.dp * c.cp; }

bool dp_inter_node(const ClusterSpec& cl, const PlanConfig& c) {
  return grad_group(c) > 1 && grad_group(c) * c.tp > cl.devices_per_node;
}

// A cp group spans nodes when cp x tp (its ranks and the tp ranks between them) exceeds a node.
bool cp_inter_node(const ClusterSpec& cl, const PlanConfig& c) {
  return c.cp > 1 && c.cp * c.tp > cl.devices_per_node;
}

// ZeRO 3's parameter all-gathers: each piece's buckets are gathered before its forward and again
// before its backward, the next piece's prefetched (issued) while the current one computes. As
// DecoderModel does, the LM head (piece `last`) stays gathered from its forward to its backward,
// and the embedding (piece -1) is not gathered for its backward, which reads no parameters.
class ParamGathers {
 public:
  ParamGathers(Sim& sim, const BucketPlan& bp, const PlanConfig& c, int first, int last)
      : sim_(sim),
        bp_(bp),
        on_(c.zero == 3 && grad_group(c) > 1),
        dp_(grad_group(c)),
        first_(first),
        last_(last) {}

  // A pass begins: forward walks the pieces first..last, backward last..first.
  void start(bool forward) {
    if (!on_) return;
    forward_ = forward;
    if (forward) {
      ids_.clear();
    } else {
      for (auto it = ids_.begin(); it != ids_.end();)
        it = it->first == last_ ? ++it : ids_.erase(it);
    }
    issue(forward ? first_ : last_);
  }

  // The piece is about to compute: its gathers are waited for and the next piece's issued.
  void need(int piece) {
    if (!on_) return;
    issue(piece);
    const int next = forward_ ? piece + 1 : piece - 1;
    if (next >= (forward_ ? first_ : 0) && next <= last_) issue(next);
    for (int id : ids_[piece]) sim_.wait(id);
  }

 private:
  void issue(int piece) {
    if (ids_.count(piece)) return;
    std::vector<int>& ids = ids_[piece];
    for (size_t k = 0; k < bp_.bytes.size(); ++k)
      if (bp_.launch_after[k] == piece)
        ids.push_back(sim_.issue({CommOp::AllGather, true, bp_.bytes[k], dp_}));
  }

  Sim& sim_;
  const BucketPlan& bp_;
  bool on_;
  int dp_, first_, last_;
  bool forward_ = true;
  std::map<int, std::vector<int>> ids_;
};

// One step: accum micro-batches of forward + backward, the dp buckets launched during the last
// one's backward, then the wait for all of them.
Sim simulate(const ModelSpec& m, const ClusterSpec& cl, const PlanConfig& c) {
  const int group = grad_group(c);
  const int per_node = std::max(1, std::min(group, cl.devices_per_node / c.tp));
  Sim sim(cl, dp_inter_node(cl, c), per_node, c.overlap, cp_inter_node(cl, c));
  const Shape s = shape_of(m, c);
  const std::vector<Piece> ps = pieces(m);
  const BucketPlan bp = buckets(m, c);
  const double h = s.h, V = static_cast<double>(m.vocab);
  const LinearDesc lm_head = lm_head_linear(m.hidden, m.vocab);
  // Causal attention, counted at half (as layer_flops): 2 T s h per replica, / tp; a cp rank's
  // queries are 1 / cp of them, times the layout's imbalance (1 for CpLayout's).
  const double attn_flops =
      attention_core_flops(c.micro_batch, m.seq, m.hidden, c.tp) / 2 / c.cp * s.imbalance;
  const Overlap dp_ov = c.overlap == Overlap::None ? Overlap::None : Overlap::Async;
  // The LM's styles (dist/style.h, as model/lm.cpp builds them): the embedding's partial lookup
  // redistributed to the blocks' placement, the head colwise with loss-parallel logits.
  const Redistribution embed_out = vocab_parallel_embedding(s.sp).out();
  const ParallelStyle head = loss_parallel_head(s.sp);
  Block blk(sim, cl, s, c.overlap);
  const int P = static_cast<int>(ps.size());
  ParamGathers pg(sim, bp, c, V > 0 ? -1 : 0, P);
  for (int mb = 0; mb < c.accum; ++mb) {
    const bool last = mb == c.accum - 1;
    pg.start(/*forward=*/true);
    if (V > 0) {
      pg.need(-1);
      // Vocab-parallel embedding: a row gather, then partial -> sequence shard / replicate.
      blk.ew(2 * s.T * h * s.es);
      blk.wait(blk.redist(embed_out, s.T * h * s.es));
    }
    for (int i = 0; i < P; ++i) {
      pg.need(i);
      ps[static_cast<size_t>(i)].attention ? blk.attention_fwd(attn_flops) : blk.mlp_fwd();
    }
    pg.start(/*forward=*/false);
    if (V > 0) {
      pg.need(P);
      blk.norm_fwd();
      blk.linear_fwd(lm_head, head);
      // Vocab-parallel cross entropy: softmax over the local logits, max / sum / target over tp.
      blk.ew(3 * s.T * ceil_div(V, c.tp) * 4);
      if (s.comm)
        for (int i = 0; i < 3; ++i) sim.wait(blk.coll(CommOp::AllReduce, s.T * 4));
      blk.ew(2 * s.T * ceil_div(V, c.tp) * s.es);
      blk.wait(blk.linear_bwd(lm_head, head));
      blk.norm_bwd();
    }
    size_t next_bucket = 0;
    auto launch_ready = [&](int piece) {
      while (last && next_bucket < bp.bytes.size() && bp.launch_after[next_bucket] >= piece) {
        // ZeRO 2 and 3 reduce-scatter the bucket (its input bytes), 0 and 1 all-reduce it.
        const CommOp op = c.zero >= 2 ? CommOp::ReduceScatter : CommOp::AllReduce;
        Collective col{op, true, bp.bytes[next_bucket], group};
        // GradSync::mark_ready settles the deferred norm gradients before it reads a bucket.
        if (group > 1 || c.zero >= 2) blk.settle_grads();
        if (group > 1) {
          const int id = sim.issue(col);
          if (dp_ov == Overlap::None) sim.wait(id);
        }
        ++next_bucket;
      }
    };
    launch_ready(static_cast<int>(ps.size()));  // the LM head's parameters
    for (size_t i = ps.size(); i-- > 0;) {
      pg.need(static_cast<int>(i));
      // Full activation recomputation (Megatron's --recompute-granularity full): the layer's
      // forward again, from its saved input, just before its backward.
      if (c.recompute) ps[i].attention ? blk.attention_fwd(attn_flops) : blk.mlp_fwd();
      ps[i].attention ? blk.attention_bwd(attn_flops) : blk.mlp_bwd();
      launch_ready(static_cast<int>(i));
    }
    blk.settle_grads();  // BlockStack::backward's end
    if (V > 0) {
      blk.wait(blk.redist(embed_out.grad(), s.T * h * s.es));
      blk.ew(2 * s.T * h * s.es);  // scatter-add into the embedding gradient
    }
    launch_ready(-1);
  }
  sim.wait_all_dp();
  // ZeRO 1 and 2: each rank updated its shard; the parameters are all-gathered bucket by bucket
  // before the next forward (GradSync::gather_all_params), none of it under compute.
  if (group > 1 && (c.zero == 1 || c.zero == 2)) {
    for (double b : bp.bytes) sim.issue({CommOp::AllGather, true, b, group});
    sim.wait_all_dp();
  }
  return sim;
}

}  // namespace

double ClusterSpec::attention_bwd_eff() const {
  return attention_bwd_efficiency > 0 ? attention_bwd_efficiency : attention_eff;
}

std::vector<Collective> tp_collectives(const ModelSpec& m, const PlanConfig& c) {
  // The record of the timing model's own issue calls (one micro-batch, no dp), so the counts the
  // tests compare with a real run are the ones the times are computed from.
  PlanConfig one = c;
  one.accum = 1;
  one.dp = 1;
  ClusterSpec cl;
  cl.devices_per_node = c.tp;
  cl.peak_tflops = 1;
  cl.mem_bw_gbps = 1;
  for (int i = 0; i < 3; ++i) cl.intra[i] = cl.inter[i] = {1, 0};
  std::vector<Collective> log = simulate(m, cl, one).log;
  log.erase(std::remove_if(log.begin(), log.end(), [](const Collective& x) { return x.cp; }),
            log.end());
  return log;
}

std::vector<double> dp_bucket_bytes(const ModelSpec& m, const PlanConfig& c) {
  return buckets(m, c).bytes;
}

std::vector<Collective> dp_collectives(const ModelSpec& m, const PlanConfig& c) {
  std::vector<Collective> out;
  if (grad_group(c) <= 1) return out;
  for (double b : dp_bucket_bytes(m, c)) out.push_back({CommOp::AllReduce, true, b, grad_group(c)});
  return out;
}

namespace {

// What the caching allocators hand out for a request (their size classes).
double rounded(double bytes) {
  return bytes <= 0 ? 0 : static_cast<double>(allocator_size_class(static_cast<size_t>(bytes)));
}

// The allocations of one rank in program order, as the block code makes and drops them
// (model/blocks.cpp, model/linear.cpp, the benchmark's step loop): the peak is what a caching
// allocator that reuses a block as soon as it is freed shows (CUDA; host streams with
// MESHRT_LAUNCH_BLOCKING=1).
class MemWalk {
 public:
  int alloc(double bytes) {
    bytes = rounded(bytes);
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    sizes_.push_back(bytes);
    return static_cast<int>(sizes_.size()) - 1;
  }
  void free(int& id) {
    if (id < 0) return;
    live_ -= sizes_[static_cast<size_t>(id)];
    sizes_[static_cast<size_t>(id)] = 0;
    id = -1;
  }
  double live() const { return live_; }
  double peak() const { return peak_; }

 private:
  double live_ = 0, peak_ = 0;
  std::vector<double> sizes_;
};

// The tensors one piece keeps from its forward to its backward.
struct Saved {
  std::vector<int> ids;
};

class MemBlock {
 public:
  MemBlock(MemWalk& w, const Shape& s, double heads) : w_(w), s_(s), heads_(heads) {}

  double Al() const { return s_.Tl * s_.h * s_.es; }  // between blocks (sequence shard under SP)
  double Q() const { return s_.T * s_.h / s_.tp * s_.es; }
  double F() const { return s_.T * ceil_div(s_.f, s_.tp) * s_.es; }
  double stats() const { return s_.Tl * 4; }

  double in_bytes(const LinearDesc& l) const { return s_.T * l.in_local(s_.tp) * s_.es; }
  double out_bytes(const LinearDesc& l) const { return s_.T * l.out_local(s_.tp) * s_.es; }
  // A linear's forward (model/linear.cpp), its buffers those its parallel style (dist/style.h)
  // calls for: the output (a sequence shard after a reduce-scatter); while the GEMM runs, the
  // redistributed input, or the partial output before it is reduce-scattered.
  int linear_fwd(const LinearDesc& l) {
    const ParallelStyle st = linear_style(l, s_.sp);
    const Redistribution rin = st.in(), rout = st.out();
    const bool scatter = !rout.is_identity() && rout.to.is_shard();
    const int y = w_.alloc(scatter ? out_bytes(l) / s_.tp : out_bytes(l));
    int xin = rin.is_identity() ? -1 : w_.alloc(in_bytes(l));
    int partial = scatter ? w_.alloc(out_bytes(l)) : -1;
    w_.free(xin);
    w_.free(partial);
    return y;
  }
  // Its backward: the redistributed output gradient and the re-gathered input while the local
  // input gradient is computed, which is reduce-scattered into the returned gradient when the
  // input was a sequence shard (else returned itself, all-reduced in place).
  int linear_bwd(const LinearDesc& l) {
    const ParallelStyle st = linear_style(l, s_.sp);
    const Redistribution rin = st.in(), gout = st.out().grad(), gin = rin.grad();
    int dyc = gout.is_identity() ? -1 : w_.alloc(out_bytes(l));
    int xfull = rin.is_identity() ? -1 : w_.alloc(in_bytes(l));
    int local = w_.alloc(in_bytes(l));
    const bool scatter = !gin.is_identity() && !gin.to.is_replicate();
    const int dx = scatter ? w_.alloc(in_bytes(l) / s_.tp) : local;
    w_.free(dyc);
    w_.free(xfull);
    if (scatter) w_.free(local);
    return dx;
  }

  // Forward of a piece: its output; `sv` gets what the backward needs.
  int attention_fwd(Saved& sv) {
    int st = w_.alloc(2 * stats());  // norm mean and rstd
    const int ln = w_.alloc(Al());
    int qkv = linear_fwd(attn_[0]);
    const int q = w_.alloc(Q()), k = w_.alloc(Q()), v = w_.alloc(Q()), o = w_.alloc(Q());
    const int lse = w_.alloc(s_.T * heads_ / s_.tp * 4);
    cp_buffers(/*bwd=*/false);
    const int attn = w_.alloc(Q());
    int y = linear_fwd(attn_[1]);
    const int out = w_.alloc(Al());
    w_.free(qkv);
    w_.free(y);
    sv.ids = {st, ln, q, k, v, o, lse, attn};
    return out;
  }
  int mlp_fwd(Saved& sv) {
    const int st = w_.alloc(2 * stats());
    const int ln = w_.alloc(Al());
    const int h1 = linear_fwd(mlp_[0]);
    const int g = w_.alloc(F());
    int y = linear_fwd(mlp_[1]);
    const int out = w_.alloc(Al());
    w_.free(y);
    sv.ids = {st, ln, h1, g};
    return out;
  }
  // Backward of a piece: the input gradient; frees what the forward saved.
  // `input`: the piece's input, held by its norm until the norm's backward (-1: the caller's).
  int attention_bwd(Saved& sv, int& input) {
    int& st = sv.ids[0];
    int &ln = sv.ids[1], &lse = sv.ids[6], &attn = sv.ids[7];
    int dattn = linear_bwd(attn_[1]);
    w_.free(attn);
    int dO = w_.alloc(Q());
    int dq = w_.alloc(Q()), dk = w_.alloc(Q()), dv = w_.alloc(Q());
    cp_buffers(/*bwd=*/true);
    int dqkv = w_.alloc(3 * Q());
    for (int i = 2; i <= 5; ++i) w_.free(sv.ids[static_cast<size_t>(i)]);
    w_.free(lse);
    int dln = linear_bwd(attn_[0]);
    w_.free(ln);
    const int dx = norm_bwd(st, input);
    for (int* t : {&dattn, &dO, &dq, &dk, &dv, &dqkv, &dln}) w_.free(*t);
    return dx;
  }
  int mlp_bwd(Saved& sv, int& input) {
    int &st = sv.ids[0], &ln = sv.ids[1], &h1 = sv.ids[2], &g = sv.ids[3];
    int dg = linear_bwd(mlp_[1]);
    w_.free(g);
    int dh = w_.alloc(F());
    w_.free(h1);
    int dln = linear_bwd(mlp_[0]);
    w_.free(ln);
    const int dx = norm_bwd(st, input);
    for (int* t : {&dg, &dh, &dln}) w_.free(*t);
    return dx;
  }

 private:
  // What cp's attention allocates while it runs and frees on return, as
  // dist/context_parallel.cpp's cp_attention_fwd / _bwd do with CpLayout's 2 chunks per rank:
  // the query, output (and output gradient, dq) and log-sum-exp cut into chunks, one chunk's
  // partial results, and the exchange's buffers. ring: two packed K/V shards (and two dK/dV
  // travelling with them in the backward). allgather: this rank's packed shard while every rank's
  // K/V is gathered, then in the backward their gradients and this rank's reduce-scattered dK/dV.
  void cp_buffers(bool bwd) {
    if (s_.cp == 1) return;
    const double lse = s_.T * heads_ / s_.tp * 4, kv = 2 * Q(), all = s_.cp * kv;
    std::vector<int> ids;
    const auto keep = [&](double bytes) { ids.push_back(w_.alloc(bytes)); };
    for (int i = 0; i < (bwd ? 3 : 2); ++i) keep(Q());  // q, o (, dout) in chunks
    keep(lse);
    if (bwd) {
      keep(Q());                                  // dq, accumulated
      for (int i = 0; i < 3; ++i) keep(Q() / 2);  // one block's dq, dk, dv
    } else {
      keep(Q() / 2);  // one block's output
      keep(lse / 2);  // and its lse
    }
    if (s_.cp_comm == CpComm::Ring) {
      for (int i = 0; i < (bwd ? 4 : 2); ++i) keep(kv);  // K/V (and dK/dV) double buffers
    } else {
      int mine = w_.alloc(kv);
      keep(all);
      w_.free(mine);  // gather_kv's packed shard, dropped once gathered
      if (bwd) {
        keep(all);  // every rank's dK/dV
        keep(kv);   // this rank's, reduce-scattered
      }
    }
    for (int& id : ids) w_.free(id);
  }
  int norm_bwd(int& st, int& input) {
    const int dx = w_.alloc(Al());
    w_.free(st);
    w_.free(input);
    return dx;
  }
  MemWalk& w_;
  Shape s_;
  double heads_;
  std::vector<LinearDesc> attn_ = piece_linears(PieceKind::Attention, s_.hidden, s_.ffn);
  std::vector<LinearDesc> mlp_ = piece_linears(PieceKind::Mlp, s_.hidden, s_.ffn);
};

}  // namespace

Memory memory_per_device(const ModelSpec& m, const PlanConfig& c) {
  Memory mem;
  const Shape s = shape_of(m, c);
  // Weights one allocation each, gradients in the dp buckets' flat buffers
  // (dist/data_parallel.cpp), in the parameters' dtype, each rounded to the allocators' size
  // classes.
  double params = 0;
  for (const auto& p : local_params(m, c)) {
    params += p.first;
    mem.weights += rounded(p.first);
  }
  const BucketPlan plan = buckets(m, c);
  std::vector<double> bucket_bytes = plan.bytes;
  // ZeRO's shards (dist/data_parallel.h), over dp x cp.
  const double dp = c.zero > 0 ? grad_group(c) : 1;
  if (c.zero == 3) {
    // Each bucket's parameter shard, and the full buffers of at most three pieces (the current
    // one, the prefetched one and one being freed: GradSync::kMaxGatheredPieces); at stage 3 a
    // bucket's launch_after is its only piece.
    mem.weights = 0;
    std::map<int, double> whole;  // piece -> its buckets' full buffers
    for (size_t i = 0; i < bucket_bytes.size(); ++i) {
      mem.weights += rounded(std::ceil(bucket_bytes[i] / dp));
      whole[plan.launch_after[i]] += rounded(std::ceil(bucket_bytes[i] / dp) * dp);
    }
    std::vector<double> largest;
    for (const auto& w : whole) largest.push_back(w.second);
    std::sort(largest.begin(), largest.end(), std::greater<>());
    for (size_t i = 0; i < largest.size() && i < 3 && grad_group(c) > 1; ++i)
      mem.weights += largest[i];
  }
  if (c.zero >= 2) {
    // Each bucket's shard, and at most three full buckets alive during backward.
    std::sort(bucket_bytes.begin(), bucket_bytes.end(), std::greater<>());
    for (size_t i = 0; i < bucket_bytes.size(); ++i)
      mem.grads +=
          rounded(std::ceil(bucket_bytes[i] / dp)) + (i < 3 ? rounded(bucket_bytes[i]) : 0);
  } else {
    for (double b : bucket_bytes) mem.grads += rounded(b);
  }
  // AdamW's state (exp_avg, exp_avg_sq in f32; ZeRO >= 1: this rank's shard of them).
  if (c.optimizer)
    mem.optimizer =
        std::ceil(params / s.es / dp) * optimizer_state_bytes_per_element(OptimizerKind::AdamW);
  const double T = s.T, es = s.es, V = static_cast<double>(m.vocab);
  const double Vl = ceil_div(V, c.tp);
  MemWalk w;
  MemBlock blk(w, s, static_cast<double>(m.heads));
  const std::vector<Piece> ps = pieces(m);
  // The step's input and output gradient, and what the benchmark's loop still holds from the
  // step before: its output and input gradient (a training loop holds its batch and logits).
  w.alloc(blk.Al());  // x
  w.alloc(blk.Al());  // dout
  int prev_out = w.alloc(blk.Al());
  w.alloc(blk.Al());             // the previous input gradient, replaced only after the backward
  if (V > 0) w.alloc(blk.Al());  // the embedding's output
  std::vector<Saved> saved(ps.size());
  std::vector<int> inputs;  // each piece's input: -1 for the stack's (the caller keeps it)
  int h_cur = -1;
  for (size_t i = 0; i < ps.size(); ++i) {
    inputs.push_back(h_cur);
    Saved sv;
    h_cur = ps[i].attention ? blk.attention_fwd(sv) : blk.mlp_fwd(sv);
    if (c.recompute)
      for (int& id : sv.ids) w.free(id);  // kept: the piece's input only
    else
      saved[i] = sv;
  }
  // LM head: the final norm's output, the local logits and their f32 softmax, until the loss's
  // backward.
  int logits = V > 0 ? w.alloc(blk.Al() + T * Vl * (es + 4)) : -1;
  w.free(prev_out);  // the loop's new output replaces the one it held
  const double base = 3 * blk.Al() + (V > 0 ? blk.Al() : 0);  // x, dout, prev_dx (+ embedding)
  mem.activations = w.live() - base;
  int d = -1;  // the gradient flowing down: -1 while it is the caller's dout
  if (logits >= 0) {
    d = w.alloc(blk.Al());
    w.free(logits);
  }
  for (size_t i = ps.size(); i-- > 0;) {
    if (c.recompute) {
      // The piece's forward again from its saved input, then its backward.
      int out = ps[i].attention ? blk.attention_fwd(saved[i]) : blk.mlp_fwd(saved[i]);
      w.free(out);
    }
    const int dx =
        ps[i].attention ? blk.attention_bwd(saved[i], inputs[i]) : blk.mlp_bwd(saved[i], inputs[i]);
    w.free(d);
    d = dx;
  }
  mem.workspace = std::max(0.0, w.peak() - mem.activations - base);
  mem.activations += base;
  return mem;
}

double causal_imbalance(int64_t seq, int cp, bool balanced) {
  MESHRT_CHECK(cp >= 1 && seq >= 2 * cp, "causal_imbalance: seq "
                                             << seq << " and cp " << cp
                                             << " need cp >= 1 and seq >= 2 x cp");
  // Chunk j (of n = 2 x cp, the last taking the remainder) holds tokens [j c, (j+1) c); token t
  // attends to t + 1 keys, so the chunk's work is the sum of t + 1 over its tokens.
  const int n = 2 * cp;
  const double c = static_cast<double>(seq / n);
  auto chunk_work = [&](int j) {
    const double lo = j * c, hi = j + 1 == n ? static_cast<double>(seq) : lo + c;
    return (hi * (hi + 1) - lo * (lo + 1)) / 2;
  };
  double max = 0, sum = 0;
  for (int r = 0; r < cp; ++r) {
    const double w = balanced ? chunk_work(r) + chunk_work(n - 1 - r)
                              : chunk_work(2 * r) + chunk_work(2 * r + 1);
    max = std::max(max, w);
    sum += w;
  }
  return max / (sum / cp);
}

double model_flops_per_step(const ModelSpec& m, int64_t global_batch) {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq),
               h = static_cast<double>(m.hidden);
  double fwd = layer_flops(m.kind, global_batch, m.seq, m.hidden, m.ffn, true).forward() * m.layers;
  if (m.vocab > 0) fwd += 2 * B * s * h * static_cast<double>(m.vocab);
  return 3 * fwd;
}

void check_config(const ModelSpec& m, const ClusterSpec& cl, const PlanConfig& c) {
  MESHRT_CHECK(
      c.dp >= 1 && c.tp >= 1 && c.cp >= 1 && c.micro_batch >= 1 && c.accum >= 1 && c.bucket_mb > 0,
      "plan: dp " << c.dp << ", cp " << c.cp << ", tp " << c.tp << ", micro-batch " << c.micro_batch
                  << ", accumulation " << c.accum << " and bucket " << c.bucket_mb
                  << " MiB must be positive");
  MESHRT_CHECK(c.tp <= cl.devices_per_node,
               "plan: tp=" << c.tp << " spans nodes of " << cl.devices_per_node << " devices");
  MESHRT_CHECK(m.hidden % c.tp == 0,
               "plan: hidden " << m.hidden << " does not divide by tp=" << c.tp);
  MESHRT_CHECK(m.kind == LayerKind::Mlp || m.heads % c.tp == 0,
               "plan: heads " << m.heads << " do not divide by tp=" << c.tp);
  MESHRT_CHECK(m.ffn >= c.tp, "plan: ffn " << m.ffn << " < tp=" << c.tp);
  // cp's layout: 2 x cp chunks of the sequence (CpLayout's rule and message).
  if (c.cp > 1) CpLayout::make(m.seq, c.cp);
  const int64_t seq = m.seq / c.cp;  // a cp rank's tokens of each sequence
  const bool sp = c.sp && c.tp > 1;
  MESHRT_CHECK(!sp || seq % c.tp == 0,
               "plan: seq " << m.seq << (c.cp > 1 ? " / cp=" + std::to_string(c.cp) : "")
                            << " does not divide by tp=" << c.tp << " under sequence parallel");
  MESHRT_CHECK(c.overlap != Overlap::Chunked || c.tp == 1 || (sp && seq % (c.tp * c.tp) == 0),
               "plan: chunked overlap needs sequence parallel and seq" << (c.cp > 1 ? " / cp" : "")
                                                                       << " divisible by tp^2");
}

Prediction predict(const ModelSpec& m, const ClusterSpec& cl, const PlanConfig& c) {
  check_config(m, cl, c);
  MESHRT_CHECK(cl.peak_tflops > 0 && cl.mem_bw_gbps > 0,
               "cluster " << cl.name << ": peak FLOP/s and memory bandwidth must be positive");
  Sim sim = simulate(m, cl, c);
  Prediction r = sim.r;
  r.cfg = c;
  r.inter_node_dp = dp_inter_node(cl, c);
  r.mem = memory_per_device(m, c);
  if (c.optimizer) {
    // AdamW over the local parameters: read param, grad, m, v; write param, m, v.
    const double es = static_cast<double>(dtype_size(m.dtype));
    const double n = r.mem.weights / es;
    const double state = optimizer_state_bytes_per_element(OptimizerKind::AdamW);
    r.optimizer_s = n * (3.0 * es + 2 * state) / (cl.mem_bw_gbps * 1e9);
  }
  r.step_s = sim.now() + r.optimizer_s;
  const int64_t gb = static_cast<int64_t>(c.dp) * c.micro_batch * c.accum;
  r.model_flops = model_flops_per_step(m, gb);
  r.tokens_per_s = static_cast<double>(gb) * static_cast<double>(m.seq) / r.step_s;
  r.mfu =
      r.model_flops / r.step_s / (static_cast<double>(c.dp) * c.cp * c.tp * cl.peak_tflops * 1e12);
  r.cp_imbalance = shape_of(m, c).imbalance;
  const double have = cl.memory_gib * 1024.0 * 1024.0 * 1024.0;
  r.fits = cl.memory_gib <= 0 || r.mem.total() <= have;
  r.overflow_bytes = r.fits ? 0 : r.mem.total() - have;
  return r;
}

namespace {
// Layouts with more accumulation steps than this are not listed: the simulation walks each
// micro-batch, and a global batch of 2^40 would otherwise ask for 2^31 of them.
constexpr int64_t kMaxPlannedAccum = 4096;

// The divisors of n >= 1, ascending, found up to sqrt(n): micro-batch sizes of a global batch
// of any size without walking every number below it.
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> lo, hi;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    lo.push_back(d);
    if (d != n / d) hi.push_back(n / d);
  }
  lo.insert(lo.end(), hi.rbegin(), hi.rend());
  return lo;
}
}  // namespace

namespace {
// plan_all's layouts of one mesh (`c`'s dp, cp, tp and exchange) with `per` sequences per dp
// replica per step: sp off / on, the micro-batches and the buckets.
void plan_layout(const ModelSpec& m, const ClusterSpec& cl, int64_t per,
                 const std::vector<double>& bucket_list, Overlap overlap, PlanConfig c,
                 std::vector<Prediction>& out) {
  for (int sp = 0; sp <= (c.tp > 1 ? 1 : 0); ++sp) {
    for (int64_t mb : divisors(per)) {
      if (per / mb > kMaxPlannedAccum) continue;
      for (double bucket : bucket_list) {
        // No gradient reduction: buckets do not matter.
        if (grad_group(c) == 1 && bucket != bucket_list.front()) continue;
        c.sp = sp == 1;
        c.micro_batch = mb;
        c.accum = static_cast<int>(per / mb);
        c.bucket_mb = bucket;
        c.overlap = overlap == Overlap::Chunked && !c.sp ? Overlap::Async : overlap;
        try {
          out.push_back(predict(m, cl, c));
        } catch (const Error&) {
          // A layout this model cannot take (divisibility): not a candidate.
        }
      }
    }
  }
}
}  // namespace

std::vector<Prediction> plan_all(const ModelSpec& m, const ClusterSpec& cl, int64_t global_batch,
                                 const std::vector<double>& bucket_list, Overlap overlap,
                                 bool optimizer) {
  MESHRT_CHECK(global_batch >= 1 && global_batch <= (int64_t{1} << 40),
               "--global-batch " << global_batch << " must be from 1 to 2^40 sequences per step");
  std::vector<Prediction> out;
  const int world = cl.world();
  for (int tp = 1; tp <= cl.devices_per_node; ++tp) {
    if (cl.devices_per_node % tp != 0 || world % tp != 0) continue;
    for (int64_t cp : divisors(world / tp)) {
      // cp needs 2 x cp chunks of the sequence (check_config refuses the rest).
      if (m.seq % (2 * cp) != 0 && cp > 1) continue;
      const int dp = world / tp / static_cast<int>(cp);
      if (global_batch % dp != 0) continue;
      PlanConfig c;
      c.dp = dp;
      c.tp = tp;
      c.cp = static_cast<int>(cp);
      c.optimizer = optimizer;
      for (CpComm how : {CpComm::Ring, CpComm::AllGather}) {
        if (cp == 1 && how != CpComm::Ring) continue;  // no cp: no exchange
        c.cp_comm = how;
        plan_layout(m, cl, global_batch / dp, bucket_list, overlap, c, out);
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.tokens_per_s > b.tokens_per_s;
  });
  return out;
}

std::string mesh_label(const PlanConfig& c) {
  return "dp=" + std::to_string(c.dp) + (c.cp > 1 ? ",cp=" + std::to_string(c.cp) : "") +
         ",tp=" + std::to_string(c.tp);
}

std::string config_label(const PlanConfig& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s%s%s sp=%s mb=%lld x%d bucket=%gMiB", mesh_label(c).c_str(),
                c.cp > 1 ? " " : "", c.cp > 1 ? cp_comm_name(c.cp_comm) : "",
                c.tp > 1 ? (c.sp ? "on" : "off") : "-", static_cast<long long>(c.micro_batch),
                c.accum, c.bucket_mb);
  return c.zero > 0 ? std::string(buf) + " zero=" + std::to_string(c.zero) : std::string(buf);
}

std::string why_best(const std::vector<Prediction>& all) {
  MESHRT_CHECK(!all.empty(), "why_best: no layouts");
  const Prediction& best = all.front();
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << config_label(best.cfg);
  if (!best.fits) return os.str() + " is the fastest, but no layout fits in memory";
  // The runner-up with another mesh or sequence parallelism says more than a bucket size.
  const Prediction* second = nullptr;
  for (size_t i = 1; i < all.size() && all[i].fits; ++i) {
    if (all[i].cfg.tp != best.cfg.tp || all[i].cfg.sp != best.cfg.sp ||
        all[i].cfg.cp != best.cfg.cp || all[i].cfg.cp_comm != best.cfg.cp_comm) {
      second = &all[i];
      break;
    }
  }
  if (!second && all.size() > 1 && all[1].fits) second = &all[1];
  if (!second) {
    os << " wins: it is the only layout that fits";
  } else {
    // Every layout has the same global batch: step times compare directly.
    os << " wins by " << (best.tokens_per_s / second->tokens_per_s - 1) * 100 << "% over "
       << config_label(second->cfg) << ":";
    struct Term {
      const char* name;
      double d;  // ms per step saved by the best
    };
    std::vector<Term> t = {{"compute", second->compute_s - best.compute_s},
                           {"exposed tp communication", second->tp_exposed_s - best.tp_exposed_s},
                           {"exposed dp communication", second->dp_exposed_s - best.dp_exposed_s},
                           {"exposed cp communication", second->cp_exposed_s - best.cp_exposed_s},
                           {"optimizer step", second->optimizer_s - best.optimizer_s}};
    std::sort(t.begin(), t.end(), [](const Term& a, const Term& b) { return a.d > b.d; });
    const char* sep = " ";
    for (const Term& x : t) {
      if (std::fabs(x.d) < 0.05 * std::fabs(second->step_s - best.step_s) || x.d == 0) continue;
      os << sep << std::fabs(x.d) * 1e3 << " ms " << (x.d > 0 ? "less " : "more ") << x.name;
      sep = ", ";
    }
    os << " per step";
  }
  // Faster layouts that do not fit: why they lose.
  for (const Prediction& p : all) {
    if (p.fits || p.tokens_per_s <= best.tokens_per_s) continue;
    os << "; " << config_label(p.cfg) << " would be "
       << (p.tokens_per_s / best.tokens_per_s - 1) * 100 << "% faster but needs "
       << p.mem.total() / 1073741824.0 << " GiB per device (over by "
       << p.overflow_bytes / 1073741824.0 << " GiB)";
    break;
  }
  return os.str();
}

}  // namespace meshrt::plan
