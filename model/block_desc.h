// The one description of the blocks model/blocks.cpp builds: layer kinds and their pieces, each
// piece's linear layers (and so its GEMMs on a tp rank), parameters and model FLOPs, and the
// overlap modes of their collectives. Plain arithmetic, no runtime: the executors
// (model/blocks.cpp, model/stack.cpp), the block benchmark's FLOP counts, the planner's cost model
// and calibration (plan/, plan/command/) and the C API (capi/blocks.cpp) all read it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "dist/overlap.h"
#include "dist/style_plan.h"
#include "meshrt/export.h"

namespace meshrt {

// What one layer of a block stack is: attention then MLP (a transformer layer), or one of them.
enum class LayerKind : uint8_t { Transformer, Mlp, Attention };
MESHRT_API const char* layer_kind_name(LayerKind k);  // "block", "mlp", "attn"
// Parses block|transformer, mlp, attn|attention; throws listing the accepted names.
MESHRT_API LayerKind parse_layer_kind(std::string_view s);

// One piece of a layer: an attention block (norm, colwise fused QKV, attention on the local
// heads, rowwise out-projection) or an MLP block (norm, colwise fc1, bias + GeLU, rowwise fc2).
enum class PieceKind : uint8_t { Attention, Mlp };
MESHRT_API const char* piece_name(PieceKind p);  // "attn", "mlp": its linears' names' prefix
// The pieces of one layer, in forward order.
MESHRT_API std::vector<PieceKind> layer_pieces(LayerKind kind);

// ceil(n / parts): the largest shard of n split over parts (tp rank 0's; placement.h's rule).
inline int64_t largest_shard(int64_t n, int parts) { return (n + parts - 1) / parts; }

// A GEMM C[m, n] = A[m, k] B[k, n] as ops::gemm sees it.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
  bool operator==(const GemmShape&) const = default;
};

// A linear layer of a piece: a full [in, out] weight, sharded over tp by columns (colwise: out)
// or by rows (rowwise: in) as the style plan (dist/style_plan.h) says, with a bias of [out].
struct LinearDesc {
  const char* name = "";  // "qkv", "proj", "fc1", "fc2": the parameter names' suffix
  int64_t in = 0, out = 0;
  LinearStyle style = LinearStyle::Colwise;
  // The bias gradient is a row-sum GEMM in the linear's backward (fc1's bias is fused into the
  // GeLU instead: its gradient comes from the GeLU's backward).
  bool bias_row_sum = true;
  bool colwise() const { return style == LinearStyle::Colwise; }
  int64_t in_local(int tp) const { return colwise() ? in : largest_shard(in, tp); }
  int64_t out_local(int tp) const { return colwise() ? largest_shard(out, tp) : out; }
};

// The linears of a piece in forward order: attention qkv [h, 3h], proj [h, h]; MLP fc1 [h, ffn],
// fc2 [ffn, h]; each with the style `styles` gives its name within the layer ("attn.qkv",
// "mlp.fc2"): by default qkv and fc1 colwise, proj and fc2 rowwise.
MESHRT_API std::vector<LinearDesc> piece_linears(PieceKind p, int64_t hidden, int64_t ffn,
                                                 const StylePlan& styles = default_style_plan());

// The vocab-parallel LM head (model/lm.h): [hidden, vocab] colwise over tp, no bias.
MESHRT_API LinearDesc lm_head_linear(int64_t hidden, int64_t vocab);

// The GEMMs of one linear on one tp rank over `tokens` rows (the full sequence x batch, which a
// colwise linear gathers under sequence parallelism first), as model/linear.cpp issues them:
// forward x W, dgrad dy W^T, wgrad x^T dy, and the bias row sum (ones dy) when bias_row_sum.
// Chunked overlap issues the forward as tp x tp GEMMs of tokens / tp^2 rows each. Under sequence
// parallel, async issues a colwise forward, and async and chunked a rowwise dgrad, as tp GEMMs of
// tokens / tp rows (one per sequence shard, the rank's own first while the all-gather runs).
struct LinearGemms {
  GemmShape fwd, dgrad, wgrad, bias;
  bool has_bias_gemm = false;
};
MESHRT_API LinearGemms linear_gemms(const LinearDesc& l, int64_t tokens, int tp);

// The attention core of one rank (fused kernel, not GEMMs): batch x local heads of [seq, d]
// queries against [seq, d] keys and values: QK^T and PV, each 2 seq^2 d FLOPs per head.
MESHRT_API double attention_core_flops(int64_t batch, int64_t seq, int64_t hidden, int tp = 1);

// The parameters of a piece in forward order (norm gain and bias, then each linear's weight and
// bias), as local element counts on tp rank 0 (the largest shard when tp does not divide).
MESHRT_API std::vector<int64_t> piece_param_counts(PieceKind p, int64_t hidden, int64_t ffn,
                                                   int tp = 1);

// Where tp rank `rank`'s shard of a piece's parameter `index` (piece_param_counts' order) lies
// along the one dim it is split on: a colwise linear's weight and bias on out, a rowwise linear's
// weight on in, by placement.h's rule (uneven allowed; attention's whole heads when tp divides
// heads). Replicated parameters (the norm's, a rowwise bias): offset 0 and size hidden. The
// executors' parameters (make_param) and the C API's shard_info calls follow it.
struct ParamShard {
  int64_t offset = 0, size = 0;
  bool split = false;
};
MESHRT_API ParamShard piece_param_shard(PieceKind p, int64_t hidden, int64_t ffn, int index, int tp,
                                        int rank);

// Model FLOPs of one layer's forward pass for `batch` sequences of `seq` tokens (all replicas:
// pass the global batch): the matrix multiplies of the description at tp = 1, 2 FLOPs per
// multiply-add; norms, GeLU, softmax and residual adds are not counted (they are a few percent
// and not "model FLOPs").
struct LayerFlops {
  double qkv = 0;        // 6 B s h^2: the fused QKV projection
  double attn = 0;       // 4 B s^2 h (QK^T and PV), halved under the causal mask when halved
  double attn_full = 0;  // the same without halving, for reference
  double proj = 0;       // 2 B s h^2: the attention output projection
  double mlp = 0;        // 4 B s h ffn: fc1 and fc2
  double forward() const { return qkv + attn + proj + mlp; }
};

// `causal_halved`: count the causal score / value products at half, which is what meshrt's fused
// attention kernels compute (host and CUDA both skip key tiles above the diagonal).
MESHRT_API LayerFlops layer_flops(LayerKind kind, int64_t batch, int64_t seq, int64_t hidden,
                                  int64_t ffn, bool causal_halved = true);

// FLOPs of one training step: forward, plus 2x forward for backward (dgrad + wgrad) unless
// forward only.
MESHRT_API double step_flops(const LayerFlops& per_layer, int layers, bool fwd_only);

}  // namespace meshrt
