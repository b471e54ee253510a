#include "model/block_desc.h"

#include "dist/placement.h"
#include "runtime/error.h"

namespace meshrt {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Transformer:
      return "block";
    case LayerKind::Mlp:
      return "mlp";
    case LayerKind::Attention:
      return "attn";
  }
  return "?";
}

LayerKind parse_layer_kind(std::string_view s) {
  if (s == "block" || s == "transformer") return LayerKind::Transformer;
  if (s == "mlp") return LayerKind::Mlp;
  if (s == "attn" || s == "attention") return LayerKind::Attention;
  MESHRT_FAIL("unknown block kind '" << s << "': use block (attention + MLP), mlp or attn");
}

std::vector<PieceKind> layer_pieces(LayerKind kind) {
  std::vector<PieceKind> p;
  if (kind != LayerKind::Mlp) p.push_back(PieceKind::Attention);
  if (kind != LayerKind::Attention) p.push_back(PieceKind::Mlp);
  return p;
}

const char* piece_name(PieceKind p) { return p == PieceKind::Attention ? "attn" : "mlp"; }

std::vector<LinearDesc> piece_linears(PieceKind p, int64_t hidden, int64_t ffn,
                                      const StylePlan& styles) {
  std::vector<LinearDesc> l;
  if (p == PieceKind::Attention)
    l = {{"qkv", hidden, 3 * hidden, {}, true}, {"proj", hidden, hidden, {}, true}};
  else
    l = {{"fc1", hidden, ffn, {}, false}, {"fc2", ffn, hidden, {}, true}};
  for (LinearDesc& d : l) d.style = styles.style_of(std::string(piece_name(p)) + "." + d.name);
  return l;
}

LinearDesc lm_head_linear(int64_t hidden, int64_t vocab) {
  return {"head", hidden, vocab, default_style_plan().style_of("lm.head"), false};
}

LinearGemms linear_gemms(const LinearDesc& l, int64_t tokens, int tp) {
  const int64_t in = l.in_local(tp), out = l.out_local(tp);
  LinearGemms g;
  g.fwd = {tokens, out, in};
  g.dgrad = {tokens, in, out};
  g.wgrad = {in, out, tokens};
  g.bias = {1, out, tokens};
  g.has_bias_gemm = l.bias_row_sum;
  return g;
}

double attention_core_flops(int64_t batch, int64_t seq, int64_t hidden, int tp) {
  // QK^T and PV over the local heads: 2 x 2 s^2 d per head, heads x d = hidden / tp.
  return 4.0 * static_cast<double>(batch) * static_cast<double>(seq) * static_cast<double>(seq) *
         static_cast<double>(hidden) / tp;
}

std::vector<int64_t> piece_param_counts(PieceKind p, int64_t hidden, int64_t ffn, int tp) {
  std::vector<int64_t> n = {hidden, hidden};  // the norm's gain and bias (replicated)
  for (const LinearDesc& l : piece_linears(p, hidden, ffn)) {
    n.push_back(l.in_local(tp) * l.out_local(tp));
    n.push_back(l.out_local(tp));
  }
  return n;
}

ParamShard piece_param_shard(PieceKind p, int64_t hidden, int64_t ffn, int index, int tp,
                             int rank) {
  const std::vector<LinearDesc> lin = piece_linears(p, hidden, ffn);
  const int params = 2 + 2 * static_cast<int>(lin.size());
  MESHRT_CHECK(index >= 0 && index < params && tp >= 1 && rank >= 0 && rank < tp,
               "piece_param_shard: parameter " << index << " of " << params << ", tp rank " << rank
                                               << " of " << tp);
  if (index < 2) return {0, hidden, false};  // the norm's gain and bias
  const LinearDesc& l = lin[static_cast<size_t>(index - 2) / 2];
  const bool weight = index % 2 == 0;
  if (!l.colwise() && !weight) return {0, l.out, false};  // a rowwise bias: replicated
  const int64_t n = l.colwise() ? l.out : l.in;
  return {shard_offset(n, tp, rank), shard_size(n, tp, rank), true};
}

LayerFlops layer_flops(LayerKind kind, int64_t batch, int64_t seq, int64_t hidden, int64_t ffn,
                       bool causal_halved) {
  // The closed forms of the linears' forward GEMMs at tp = 1 (qkv 2 T h 3h, proj 2 T h h, fc1 +
  // fc2 2 x 2 T h ffn, T = batch x seq) and of the attention core, in this order of operations so
  // the planner's figures stay what they were (tests/mesh/test_block_desc.cpp checks they equal
  // the GEMMs of linear_gemms).
  const double B = static_cast<double>(batch), s = static_cast<double>(seq),
               h = static_cast<double>(hidden), f = static_cast<double>(ffn);
  LayerFlops r;
  for (PieceKind p : layer_pieces(kind)) {
    if (p == PieceKind::Attention) {
      r.qkv = 6 * B * s * h * h;
      r.attn_full = attention_core_flops(batch, seq, hidden);
      r.attn = causal_halved ? r.attn_full / 2 : r.attn_full;
      r.proj = 2 * B * s * h * h;
    } else {
      r.mlp = 4 * B * s * h * f;
    }
  }
  return r;
}

double step_flops(const LayerFlops& per_layer, int layers, bool fwd_only) {
  return per_layer.forward() * layers * (fwd_only ? 1.0 : 3.0);
}

}  // namespace meshrt
