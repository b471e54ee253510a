// Transformer blocks over a DeviceMesh's tp dim: norm, MLP, attention and their composition,
// each with explicit forward and backward (saved activations, no general autograd).
// Activations are sequence-first [seq, batch, hidden]; under sequence parallel a rank holds the
// contiguous sequence shard [seq / tp, batch, hidden].
#pragma once

#include <memory>
#include <string>

#include "dist/context_parallel.h"
#include "kernels/ops.h"
#include "meshrt/export.h"
#include "model/block_desc.h"
#include "model/linear.h"
#include "model/model_spec.h"

namespace meshrt {

enum class NormKind : uint8_t { LayerNorm, RMSNorm };

struct MESHRT_API BlockConfig {
  int64_t hidden = 1024;
  int64_t ffn = 4096;
  int64_t heads = 16;
  DType dtype = DType::f32;
  NormKind norm = NormKind::LayerNorm;
  ops::GeluKind gelu = ops::GeluKind::Tanh;
  float eps = 1e-5f;
  bool bias = true;
  float init_std = 0.02f;
  // > 0: biases ~ N(0, param_noise), norm gains ~ N(1, param_noise), norm biases ~ N(0, ...)
  // instead of the usual 0 / 1 / 0 (tests use it so every parameter matters).
  float param_noise = 0.f;
  uint64_t seed = 1;
  // Attention: each position attends to itself and earlier ones only (false: to every position).
  bool causal = true;
  // Under context parallelism (a cp dim on the mesh, size > 1) how the attention exchanges K/V
  // between the cp ranks (--cp-comm ring | allgather; dist/context_parallel.h).
  CpComm cp_comm = CpComm::Ring;
  // Each linear's style by its name within the layer ("attn.qkv", "mlp.fc1": dist/style_plan.h).
  // The blocks run a colwise linear then a rowwise one in each piece (validate_block checks).
  StylePlan styles = default_style_plan();
};

// The model's shape and dtype (model/model_spec.h: hidden, ffn, heads, dtype) into a config, its
// other settings kept: how the command line (bench block, train) and the C API's block configs
// turn the one model description into the executors' config.
MESHRT_API void apply_model_spec(BlockConfig& c, const ModelSpec& m);
// The model a config's layers make: its shape and dtype, with the stack's kind, layers, sequence
// and vocabulary (the planner's input for `meshrt bench block`'s prediction).
MESHRT_API ModelSpec model_spec(const BlockConfig& c, LayerKind kind, int layers, int64_t seq,
                                int64_t vocab = 0);

// How validate_block's messages name the settings it checks, per caller: the command line's
// flags by default; the C API passes its config struct's field names (for_config_struct), as its
// callers have no flags.
struct MESHRT_API BlockFieldNames {
  struct Field {
    std::string name;    // the value's name in the message: "hidden"
    std::string change;  // what the user changes: "--hidden"
  };
  Field hidden{"hidden", "--hidden"};
  Field ffn{"ffn", "--ffn"};
  Field heads{"heads", "--heads"};
  Field seq{"sequence", "--seq"};
  std::string drop_sp = "drop --sp";  // the other way out of a sequence that tp does not divide
  // "meshrt_mlp_config": names "meshrt_mlp_config.hidden", ...; the change is "it".
  static BlockFieldNames for_config_struct(const std::string& config);
};

// Rejects shapes that cannot be sharded, before any collective runs: hidden % tp, ffn >= tp (an
// ffn that tp does not divide is sharded unevenly), and (seq > 0) seq % (2 x cp) under context
// parallelism (cp > 1: the causal load-balance layout's 2 x cp chunks) and a cp rank's
// seq / cp % tp under sequence parallel (% tp^2 for chunked overlap); with attention also
// heads % tp and hidden % heads; and that
// cfg.styles gives each piece's linears the styles the blocks run (colwise, rowwise). Messages
// name the values and what to change, in the words of `names`.
MESHRT_API void validate_block(const BlockConfig& cfg, int tp, const TpOptions& opt,
                               int64_t seq = 0, bool attention = true,
                               const BlockFieldNames& names = {}, int cp = 1);

// LayerNorm / RMSNorm over hidden in the sequence-parallel style: weights replicated over tp;
// under sequence parallel it runs on the sequence shard and its weight gradients are summed over
// tp.
class MESHRT_API Norm {
 public:
  Norm(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, NormKind kind, std::string name,
       uint64_t id, int64_t hidden, DType dtype, float eps, float noise = 0.f, uint64_t seed = 0);
  Tensor forward(const Tensor& x);
  // Adds the weight gradients (summed over tp under sequence parallel) and returns dx.
  Tensor backward(const Tensor& dy);
  void collect(std::vector<Param*>& out);
  Param gamma, beta;

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  ParallelStyle style_;
  NormKind kind_;
  float eps_;
  Tensor x_, mean_, rstd_;
};

// The packed documents of a batch (train --doc-mask): attention stays inside each document
// (causal within it, nothing across documents), under any cp.
struct PackedDocs {
  // i32 [batch, seq] on the host: the document id of every position of each whole sequence,
  // non-decreasing along a row (train/token_data.h document_ids); every cp rank holds the same.
  Tensor ids;
  // cp = 1: ids on the context's device (attention_block_fwd's q_doc and k_doc).
  Tensor device_ids;
  // cp > 1: the layout the batch was sharded with (CpLayout::balanced over its documents' work),
  // and the causal work's max / mean over the cp ranks under it and under the standard layout.
  CpLayout layout;
  double imbalance = 1, standard_imbalance = 1;
};

class MESHRT_API Block {
 public:
  virtual ~Block() = default;
  // The documents of the batch the next forward runs (null: none, attention is causal over the
  // whole sequence); that forward's backward uses the same. Only attention reads them.
  virtual void set_documents(std::shared_ptr<const PackedDocs> /*docs*/) {}
  virtual Tensor forward(const Tensor& x) = 0;
  // forward, writing the output into out (x's shape and dtype, contiguous, not aliasing x)
  // instead of a new tensor: the residual add is the last op and writes it directly.
  virtual void forward_into(const Tensor& x, const Tensor& out) = 0;
  virtual Tensor backward(const Tensor& dout) = 0;
  virtual void collect(std::vector<Param*>& out) = 0;
  std::vector<Param*> params() {
    std::vector<Param*> p;
    collect(p);
    return p;
  }
};

// x + fc2(gelu(fc1(norm(x)))): norm sequence-parallel, fc1 colwise, fc2 rowwise. No heads: its
// validation skips them.
class MESHRT_API MlpBlock : public Block {
 public:
  MlpBlock(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const BlockConfig& cfg,
           std::string name, uint64_t id_base);
  Tensor forward(const Tensor& x) override;
  void forward_into(const Tensor& x, const Tensor& out) override;
  Tensor backward(const Tensor& dout) override;
  void collect(std::vector<Param*>& out) override;

  Norm norm;
  Linear fc1;  // colwise; its bias is fused into the GeLU
  Linear fc2;  // rowwise

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  BlockConfig cfg_;
  Tensor h1_;
};

// x + proj(attention(qkv(norm(x)))), causal unless cfg.causal is false: fused QKV colwise with
// heads split over tp (weight columns laid out per head as [q | k | v] so a column shard is whole
// heads), out-proj rowwise. On a mesh with a cp dim of size > 1 every activation is the rank's
// CpLayout shard of the sequence (chunks i and 2cp-1-i, then sharded over tp under sequence
// parallel) and the attention exchanges K/V over the cp group (cp_attention_fwd / _bwd,
// cfg.cp_comm); the weight gradients are this rank's tokens' part (GradSync sums them over cp).
class MESHRT_API AttentionBlock : public Block {
 public:
  AttentionBlock(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const BlockConfig& cfg,
                 std::string name, uint64_t id_base);
  Tensor forward(const Tensor& x) override;
  void forward_into(const Tensor& x, const Tensor& out) override;
  Tensor backward(const Tensor& dout) override;
  void collect(std::vector<Param*>& out) override;
  void set_documents(std::shared_ptr<const PackedDocs> docs) override { docs_ = std::move(docs); }

  Norm norm;
  Linear qkv;   // colwise
  Linear proj;  // rowwise

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  BlockConfig cfg_;
  int64_t heads_local_, head_dim_;
  int cp_ = 1;  // the mesh's cp size
  // Refuses documents whose shape is not [batch, the whole sequence] or whose layout is not cp's.
  void check_docs(int64_t batch, int64_t local_seq) const;
  Tensor q_, k_, v_, o_, lse_;
  std::shared_ptr<const PackedDocs> docs_, fwd_docs_;  // set; the last forward's (for backward)
};

// Attention block then MLP block.
class MESHRT_API TransformerBlock : public Block {
 public:
  TransformerBlock(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                   const BlockConfig& cfg, std::string name, uint64_t id_base);
  Tensor forward(const Tensor& x) override;
  void forward_into(const Tensor& x, const Tensor& out) override;
  Tensor backward(const Tensor& dout) override;
  void collect(std::vector<Param*>& out) override;
  void set_documents(std::shared_ptr<const PackedDocs> docs) override {
    attn.set_documents(std::move(docs));
  }

  AttentionBlock attn;
  MlpBlock mlp;
};

// Parameter ids a block uses from id_base (so models give each block a disjoint range).
constexpr uint64_t kBlockIdStride = 64;

}  // namespace meshrt
