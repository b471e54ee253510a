#include "model/blocks.h"

#include <cmath>

#include "runtime/error.h"

namespace meshrt {

BlockFieldNames BlockFieldNames::for_config_struct(const std::string& config) {
  BlockFieldNames n;
  n.hidden = {config + ".hidden", "it"};
  n.ffn = {config + ".ffn", "it"};
  n.heads = {config + ".heads", "it"};
  n.seq = {"the sequence", "it"};
  n.drop_sp = "set " + config + ".sequence_parallel = 0";
  return n;
}

void apply_model_spec(BlockConfig& c, const ModelSpec& m) {
  c.hidden = m.hidden;
  c.ffn = m.ffn;
  c.heads = m.heads;
  c.dtype = m.dtype;
}

ModelSpec model_spec(const BlockConfig& c, LayerKind kind, int layers, int64_t seq, int64_t vocab) {
  ModelSpec m;
  m.hidden = c.hidden;
  m.heads = c.heads;
  m.ffn = c.ffn;
  m.seq = seq;
  m.vocab = vocab;
  m.layers = layers;
  m.dtype = c.dtype;
  m.kind = kind;
  return m;
}

namespace {
// The pieces' executors below run a colwise linear into a rowwise one (the activation between
// them stays a tp shard): a plan giving another layout needs another executor.
void validate_block_styles(const BlockConfig& cfg, bool attention) {
  const LinearStyle runs[] = {LinearStyle::Colwise, LinearStyle::Rowwise};
  for (PieceKind p : layer_pieces(attention ? LayerKind::Transformer : LayerKind::Mlp)) {
    const std::vector<LinearDesc> l = piece_linears(p, cfg.hidden, cfg.ffn, cfg.styles);
    for (size_t i = 0; i < l.size(); ++i)
      MESHRT_CHECK(l[i].style == runs[i], "block: the style plan makes "
                                              << piece_name(p) << "." << l[i].name << " "
                                              << linear_style_name(l[i].style) << ", and the "
                                              << piece_name(p) << " block runs it "
                                              << linear_style_name(runs[i]) << ": give that layer "
                                              << linear_style_name(runs[i]));
  }
}
}  // namespace

void validate_block(const BlockConfig& cfg, int tp, const TpOptions& opt, int64_t seq,
                    bool attention, const BlockFieldNames& n, int cp) {
  MESHRT_CHECK(cp >= 1, "block: cp=" << cp << " must be >= 1");
  if (seq > 0 && cp > 1) {
    MESHRT_CHECK(seq % (2 * static_cast<int64_t>(cp)) == 0,
                 "block: " << n.seq.name << " " << seq << " does not divide by 2 x cp = " << 2 * cp
                           << " (cp=" << cp
                           << "): context parallelism cuts it into 2 x cp equal chunks, rank i "
                              "holding chunks i and 2cp-1-i; change "
                           << n.seq.change << " or the mesh's cp");
    seq /= cp;  // a cp rank's tokens, which tp shards under sequence parallel
  }
  const char* cp_part = cp > 1 ? " (a cp rank's share of the sequence)" : "";
  MESHRT_CHECK(cfg.hidden > 0 && cfg.ffn > 0 && (!attention || cfg.heads > 0),
               "block: " << n.hidden.name << "=" << cfg.hidden << ", " << n.ffn.name << "="
                         << cfg.ffn << ", " << n.heads.name << "=" << cfg.heads
                         << " must all be positive");
  if (attention)
    MESHRT_CHECK(cfg.hidden % cfg.heads == 0, "block: " << n.hidden.name << " " << cfg.hidden
                                                        << " does not divide by " << n.heads.name
                                                        << " " << cfg.heads << "; pick "
                                                        << n.heads.name << " that divide it");
  MESHRT_CHECK(cfg.hidden % tp == 0, "block: " << n.hidden.name << " " << cfg.hidden
                                               << " does not divide by tp=" << tp << "; change "
                                               << n.hidden.change << " or the mesh");
  MESHRT_CHECK(cfg.ffn >= tp, "block: " << n.ffn.name << " " << cfg.ffn << " is smaller than tp="
                                        << tp << ": every rank needs at least one column; change "
                                        << n.ffn.change << " or the mesh");
  if (attention)
    MESHRT_CHECK(cfg.heads % tp == 0, "block: " << n.heads.name << " " << cfg.heads
                                                << " do not divide by tp=" << tp << "; change "
                                                << n.heads.change << " or the mesh");
  if (seq > 0 && opt.sequence_parallel && tp > 1) {
    MESHRT_CHECK(seq % tp == 0, "block: " << n.seq.name << " " << seq << cp_part
                                          << " does not divide by tp=" << tp
                                          << " under sequence parallel; change " << n.seq.change
                                          << " or " << n.drop_sp);
    if (opt.overlap == Overlap::Chunked)
      MESHRT_CHECK(seq % (static_cast<int64_t>(tp) * tp) == 0,
                   "block: chunked overlap needs seq" << cp_part << " divisible by tp^2=" << tp * tp
                                                      << "; seq is " << seq);
  }
  validate_block_styles(cfg, attention);
}

// ---- Norm ---------------------------------------------------------------------------------------

Norm::Norm(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, NormKind kind,
           std::string name, uint64_t id, int64_t hidden, DType dtype, float eps, float noise,
           uint64_t seed)
    : mesh_(mesh),
      tp_(tp),
      style_(sequence_parallel_norm(opt.sequence_parallel && tp.size() > 1)),
      kind_(kind),
      eps_(eps) {
  using D = PhiloxInit::Dist;
  const auto wpl = placements_on(mesh, kTpDim, style_.weight);
  const auto bpl = placements_on(mesh, kTpDim, style_.bias);
  gamma = noise > 0 ? make_param(mesh, name + ".weight", id, {hidden}, wpl, dtype,
                                 PhiloxInit{seed, 0, D::Normal, 1.f, noise})
                    : make_param_const(mesh, name + ".weight", id, {hidden}, wpl, dtype, 1.0);
  if (kind == NormKind::LayerNorm)
    beta = noise > 0 ? make_param(mesh, name + ".bias", id + 1, {hidden}, bpl, dtype,
                                  PhiloxInit{seed, 0, D::Normal, 0.f, noise})
                     : make_param_const(mesh, name + ".bias", id + 1, {hidden}, bpl, dtype, 0.0);
}

void Norm::collect(std::vector<Param*>& out) {
  out.push_back(&gamma);
  // By kind, not by beta's value: ZeRO 3 frees the values between uses.
  if (kind_ == NormKind::LayerNorm) out.push_back(&beta);
}

Tensor Norm::forward(const Tensor& x) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int64_t rows = x.numel() / x.size(-1);
  Tensor y = ctx.empty(x.shape(), x.dtype());
  rstd_ = ctx.empty({rows}, DType::f32);
  if (kind_ == NormKind::LayerNorm) {
    mean_ = ctx.empty({rows}, DType::f32);
    ops::layernorm_fwd(ctx, cs, x, gamma.value, &beta.value, y, mean_, rstd_, eps_);
  } else {
    ops::rmsnorm_fwd(ctx, cs, x, gamma.value, y, rstd_, eps_);
  }
  x_ = x;
  return y;
}

Tensor Norm::backward(const Tensor& dy) {
  MESHRT_CHECK(x_.defined(), "norm " << gamma.name << ": backward without forward");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  Tensor dx = ctx.empty(x_.shape(), x_.dtype());
  const bool partial = style_.partial_param_grads;
  // Under sequence parallel the weight gradients of this shard are partial: reduce this step's
  // contribution over tp before adding it (never the accumulated gradient, which would count
  // earlier micro-batches tp times). Gain and bias go in one buffer and one all-reduce, as
  // Megatron coalesces its sequence-parallel norm gradients: one sync point instead of two.
  const bool layer = kind_ == NormKind::LayerNorm;
  const int64_t h = gamma.grad.numel();
  Tensor both = partial ? ctx.empty({layer ? 2 * h : h}, gamma.grad.dtype()) : Tensor();
  Tensor dg = partial ? both.narrow(0, 0, h).view(gamma.grad.shape()) : gamma.grad;
  Tensor db;
  if (layer) db = partial ? both.narrow(0, h, h).view(beta.grad.shape()) : beta.grad;
  if (layer) {
    ops::layernorm_bwd(ctx, cs, dy, x_, gamma.value, mean_, rstd_, dx, &dg, &db, !partial);
  } else {
    ops::rmsnorm_bwd(ctx, cs, dy, x_, gamma.value, rstd_, dx, &dg, !partial);
  }
  if (partial) {
    const Redistribution r{Placement::partial(), Placement::replicate()};
    const Event reduced = redistribute(tp_, both, both, r, "norm.grad");
    // Inside a deferral the sums go into the gradients on the comm stream, behind the all-reduce,
    // and the compute stream waits only when the gradients are read (settle_grad_writes).
    const bool defer = tp_.deferring_grad_writes();
    Stream& s = defer ? tp_.comm() : cs;
    if (!defer) tp_.wait(reduced);
    ops::add(ctx, s, gamma.grad, dg, gamma.grad);
    if (layer) ops::add(ctx, s, beta.grad, db, beta.grad);
    if (defer) tp_.defer_grad_writes(s.record());
  }
  x_ = mean_ = rstd_ = Tensor();
  return dx;
}

// ---- MLP ----------------------------------------------------------------------------------------

namespace {
// Linear `i` of the piece as the description has it (model/block_desc.h): shape, sharding, and
// whether its bias goes into the next kernel's epilogue instead of a row-sum GEMM.
LinearDesc desc(PieceKind p, const BlockConfig& c, size_t i) {
  return piece_linears(p, c.hidden, c.ffn, c.styles).at(i);
}
LinearSpec lin(const BlockConfig& c, const std::string& block, uint64_t id, const LinearDesc& d) {
  LinearSpec s;
  s.name = block + "." + d.name;
  s.id = id;
  s.in = d.in;
  s.out = d.out;
  s.dtype = c.dtype;
  s.bias = c.bias;
  s.bias_in_epilogue = !d.bias_row_sum;
  s.init_std = c.init_std;
  s.bias_std = c.param_noise;
  s.seed = c.seed;
  return s;
}
bool sp(const TpOptions& opt, const CommScheduler& tp) {
  return opt.sequence_parallel && tp.size() > 1;
}
}  // namespace

MlpBlock::MlpBlock(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                   const BlockConfig& cfg, std::string name, uint64_t id)
    : norm((validate_block(cfg, tp.size(), opt, 0, /*attention=*/false), mesh), tp, opt, cfg.norm,
           name + ".norm", id, cfg.hidden, cfg.dtype, cfg.eps, cfg.param_noise, cfg.seed),
      fc1(mesh, tp, opt, lin(cfg, name, id + 2, desc(PieceKind::Mlp, cfg, 0)),
          linear_style(desc(PieceKind::Mlp, cfg, 0), sp(opt, tp))),
      fc2(mesh, tp, opt, lin(cfg, name, id + 4, desc(PieceKind::Mlp, cfg, 1)),
          linear_style(desc(PieceKind::Mlp, cfg, 1), sp(opt, tp))),
      mesh_(mesh),
      tp_(tp),
      cfg_(cfg) {}

void MlpBlock::collect(std::vector<Param*>& out) {
  norm.collect(out);
  fc1.collect(out);
  fc2.collect(out);
}

Tensor MlpBlock::forward(const Tensor& x) {
  Tensor out = mesh_.ctx().empty(x.shape(), x.dtype());
  forward_into(x, out);
  return out;
}

void MlpBlock::forward_into(const Tensor& x, const Tensor& out) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  Tensor ln = norm.forward(x);
  h1_ = fc1.forward(ln);
  Tensor g = ctx.empty(h1_.shape(), h1_.dtype());
  ops::bias_gelu_fwd(ctx, cs, h1_, cfg_.bias ? &fc1.bias.value : nullptr, g, cfg_.gelu);
  Tensor y = fc2.forward(g);
  ops::add(ctx, cs, x, y, out);
}

Tensor MlpBlock::backward(const Tensor& dout) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  Tensor dg = fc2.backward(dout).dx;  // rowwise: complete on return
  Tensor dh = ctx.empty(dg.shape(), dg.dtype());
  ops::bias_gelu_bwd(ctx, cs, dg, h1_, cfg_.bias ? &fc1.bias.value : nullptr, dh,
                     cfg_.bias ? &fc1.bias.grad : nullptr, cfg_.gelu, /*accumulate=*/true);
  h1_ = Tensor();
  InputGrad dln = fc1.backward(dh);
  tp_.wait(dln.ready);
  Tensor dx = norm.backward(dln.dx);
  ops::add(ctx, cs, dx, dout, dx);
  return dx;
}

// ---- Attention ----------------------------------------------------------------------------------

AttentionBlock::AttentionBlock(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                               const BlockConfig& cfg, std::string name, uint64_t id)
    : norm((validate_block(cfg, tp.size(), opt, 0, true, {}, mesh.size(kCpDim)), mesh), tp, opt,
           cfg.norm, name + ".norm", id, cfg.hidden, cfg.dtype, cfg.eps, cfg.param_noise, cfg.seed),
      qkv(mesh, tp, opt, lin(cfg, name, id + 2, desc(PieceKind::Attention, cfg, 0)),
          linear_style(desc(PieceKind::Attention, cfg, 0), sp(opt, tp))),
      proj(mesh, tp, opt, lin(cfg, name, id + 4, desc(PieceKind::Attention, cfg, 1)),
           linear_style(desc(PieceKind::Attention, cfg, 1), sp(opt, tp))),
      mesh_(mesh),
      tp_(tp),
      cfg_(cfg) {
  heads_local_ = cfg.heads / tp.size();
  head_dim_ = cfg.hidden / cfg.heads;
  cp_ = mesh.size(kCpDim);
}

void AttentionBlock::collect(std::vector<Param*>& out) {
  norm.collect(out);
  qkv.collect(out);
  proj.collect(out);
}

namespace {
// [s, b, h, d] view -> [b, h, s, d] view.
Tensor sbhd_to_bhsd(const Tensor& t) { return t.transpose(0, 1).transpose(1, 2); }
}  // namespace

void AttentionBlock::check_docs(int64_t batch, int64_t local_seq) const {
  const PackedDocs* d = fwd_docs_.get();
  if (d == nullptr) return;
  const int64_t seq = local_seq * cp_;
  const Tensor& t = cp_ > 1 ? d->ids : d->device_ids;
  MESHRT_CHECK(t.ndim() == 2 && t.size(0) == batch && t.size(1) == seq,
               "attention block: document ids " << t.str() << " must be [" << batch << ", " << seq
                                                << "] (batch, the whole sequence)");
  MESHRT_CHECK(cp_ == 1 || (d->layout.cp == cp_ && d->layout.seq == seq),
               "attention block: the documents' cp layout (seq "
                   << d->layout.seq << ", cp " << d->layout.cp << ") is not the "
                   << "batch's (seq " << seq << ", cp " << cp_ << ")");
}

Tensor AttentionBlock::forward(const Tensor& x) {
  Tensor out = mesh_.ctx().empty(x.shape(), x.dtype());
  forward_into(x, out);
  return out;
}

void AttentionBlock::forward_into(const Tensor& x, const Tensor& out) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  Tensor ln = norm.forward(x);
  Tensor qkv_out = qkv.forward(ln);  // [s, b, hl * 3 * d]
  const int64_t s = qkv_out.size(0), b = qkv_out.size(1), hl = heads_local_, d = head_dim_;
  Tensor v5 = qkv_out.view({s, b, hl, 3, d});
  q_ = ctx.empty({b, hl, s, d}, x.dtype());
  k_ = ctx.empty({b, hl, s, d}, x.dtype());
  v_ = ctx.empty({b, hl, s, d}, x.dtype());
  q_.copy_(sbhd_to_bhsd(v5.select(3, 0)), cs);
  k_.copy_(sbhd_to_bhsd(v5.select(3, 1)), cs);
  v_.copy_(sbhd_to_bhsd(v5.select(3, 2)), cs);
  o_ = ctx.empty({b, hl, s, d}, x.dtype());
  lse_ = ctx.empty({b, hl, s}, DType::f32);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  fwd_docs_ = docs_;
  check_docs(b, s);
  const Tensor none;
  const PackedDocs* docs = fwd_docs_.get();
  if (cp_ > 1)
    cp_attention_fwd(mesh_.group(kCpDim), ctx, cfg_.cp_comm, q_, k_, v_, o_, lse_, scale,
                     cfg_.causal, docs ? docs->ids : none, docs ? &docs->layout : nullptr);
  else if (docs)
    ops::attention_block_fwd(ctx, cs, q_, k_, v_, o_, lse_, scale, cfg_.causal, 0, 0,
                             docs->device_ids, docs->device_ids);
  else
    ops::attention_fwd(ctx, cs, q_, k_, v_, o_, lse_, scale, cfg_.causal);
  Tensor attn = ctx.empty({s, b, hl * d}, x.dtype());
  sbhd_to_bhsd(attn.view({s, b, hl, d})).copy_(o_, cs);
  Tensor y = proj.forward(attn);
  ops::add(ctx, cs, x, y, out);
}

Tensor AttentionBlock::backward(const Tensor& dout) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  Tensor dattn = proj.backward(dout).dx;  // [s, b, hl * d]; rowwise: complete on return
  const int64_t s = dattn.size(0), b = dattn.size(1), hl = heads_local_, d = head_dim_;
  Tensor dO = ctx.empty({b, hl, s, d}, dattn.dtype());
  dO.copy_(sbhd_to_bhsd(dattn.view({s, b, hl, d})), cs);
  Tensor dq = ctx.empty(q_.shape(), q_.dtype()), dk = ctx.empty(k_.shape(), k_.dtype()),
         dv = ctx.empty(v_.shape(), v_.dtype());
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const Tensor none;
  const PackedDocs* docs = fwd_docs_.get();
  if (cp_ > 1)
    cp_attention_bwd(mesh_.group(kCpDim), ctx, cfg_.cp_comm, q_, k_, v_, o_, dO, lse_, dq, dk, dv,
                     scale, cfg_.causal, docs ? docs->ids : none, docs ? &docs->layout : nullptr);
  else if (docs)
    ops::attention_block_bwd(ctx, cs, q_, k_, v_, o_, dO, lse_, dq, dk, dv, scale, cfg_.causal, 0,
                             0, docs->device_ids, docs->device_ids);
  else
    ops::attention_bwd(ctx, cs, q_, k_, v_, o_, dO, lse_, dq, dk, dv, scale, cfg_.causal);
  Tensor dqkv = ctx.empty({s, b, hl, 3, d}, dattn.dtype());
  sbhd_to_bhsd(dqkv.select(3, 0)).copy_(dq, cs);
  sbhd_to_bhsd(dqkv.select(3, 1)).copy_(dk, cs);
  sbhd_to_bhsd(dqkv.select(3, 2)).copy_(dv, cs);
  q_ = k_ = v_ = o_ = lse_ = Tensor();
  fwd_docs_.reset();
  InputGrad dln = qkv.backward(dqkv.view({s, b, hl * 3 * d}));
  tp_.wait(dln.ready);
  Tensor dx = norm.backward(dln.dx);
  ops::add(ctx, cs, dx, dout, dx);
  return dx;
}

// ---- Transformer block --------------------------------------------------------------------------

TransformerBlock::TransformerBlock(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                                   const BlockConfig& cfg, std::string name, uint64_t id)
    : attn(mesh, tp, opt, cfg, name + ".attn", id),
      mlp(mesh, tp, opt, cfg, name + ".mlp", id + 8) {}

void TransformerBlock::collect(std::vector<Param*>& out) {
  attn.collect(out);
  mlp.collect(out);
}

Tensor TransformerBlock::forward(const Tensor& x) { return mlp.forward(attn.forward(x)); }

void TransformerBlock::forward_into(const Tensor& x, const Tensor& out) {
  mlp.forward_into(attn.forward(x), out);
}

Tensor TransformerBlock::backward(const Tensor& dout) { return attn.backward(mlp.backward(dout)); }

}  // namespace meshrt
