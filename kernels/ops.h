// The op set of transformer blocks (forward and backward), dispatched on the tensors' device.
#pragma once

// Conventions shared by every op:
// - Each op takes the rank's Context and the Stream to enqueue on, then its tensors. Inputs and
//   outputs are pre-allocated by the caller (the mesh layer owns memory); an op validates shapes,
//   dtypes and devices when called and throws meshrt::Error naming the op and the shapes, then
//   enqueues the work and returns. Results are ready once the stream reaches that point.
// - Output tensors are taken as `const Tensor&`: a Tensor is a handle, the op writes its storage.
//   This lets callers pass views (narrow / select) directly.
// - Tensors must be contiguous unless an op says otherwise (GEMM accepts row-strided matrices and
//   transposed 2-D views). Elementwise ops accept out aliasing an input (in-place).
// - dtypes: the floating tensors of one op share one dtype (f32, bf16 or f16), except where noted:
//   statistics (mean, rstd, lse, cross-entropy pieces) are f32, optimizer states are f32, GEMM's C
//   may be f32 for 16-bit inputs, and cast converts. Math is done in f32.
// - On the host, ops run on the stream's worker thread and use the rank's own thread pool
//   (threads per rank = usable cores / ctx.local_ranks(), or MESHRT_HOST_THREADS). OpenBLAS is
//   driven single-threaded from those threads (see kernels/host/parallel.h for why).
// - On CUDA, ops launch on stream.native_handle(); tensors used on a stream other than the one
//   they were allocated on need Storage::record_stream by the caller, as in PyTorch.
// - Each device family's backend declares which ops it implements for which dtypes; an op it does
//   not support throws meshrt::Error naming the op, the dtype and the backend.
// - Parameter-gradient outputs (dbias, dgamma, dbeta, dweight) are overwritten, or added to
//   when `accumulate` is true (gradient accumulation over micro-batches).

#include <cstdint>
#include <span>
#include <string>

#include "meshrt/export.h"
#include "runtime/context.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt::ops {

enum class GeluKind : uint8_t { Tanh, Erf };
MESHRT_API const char* gelu_kind_name(GeluKind k);

// ---- GEMM ---------------------------------------------------------------------------------------

// c = alpha * op(a) @ op(b) + beta * c (+ bias broadcast over rows).
// Each operand is a matrix: a tensor of rank >= 2 whose leading dims flatten into rows ([..., k]
// is rows x k; e.g. activations [batch, seq, hidden]); a 2-D operand may also be a transposed
// view (unit stride on dim 0). op(x) is x^T when trans_x. Shapes: op(a) [m, k], op(b) [k, n],
// c [m, n] (c rows flattened the same way), bias [n]. dtypes: a and b equal; c and bias equal
// to a's dtype or f32.
MESHRT_API void gemm(Context& ctx, Stream& stream, const Tensor& a, bool trans_a, const Tensor& b,
                     bool trans_b, const Tensor& c, float alpha = 1.f, float beta = 0.f,
                     const Tensor* bias = nullptr);

// Batched: a [..., m, k] (or [..., k, m] when trans_a), b [..., k, n] (or [..., n, k]),
// c [..., m, n]; the leading dims are one batch of equal count for all three, with a uniform
// batch stride (e.g. [batch, heads, seq, head_dim] for attention scores).
MESHRT_API void gemm_strided_batched(Context& ctx, Stream& stream, const Tensor& a, bool trans_a,
                                     const Tensor& b, bool trans_b, const Tensor& c,
                                     float alpha = 1.f, float beta = 0.f);

// ---- elementwise --------------------------------------------------------------------------------

// out = alpha * a + beta * b (residual add). Same shapes.
MESHRT_API void add(Context& ctx, Stream& stream, const Tensor& a, const Tensor& b,
                    const Tensor& out, float alpha = 1.f, float beta = 1.f);
// out = alpha * x.
MESHRT_API void scale(Context& ctx, Stream& stream, const Tensor& x, const Tensor& out,
                      float alpha);
// out[0] += sum of x[i]^2 over every element of x (contiguous, any floating dtype), accumulated
// in f32 (host: f64 partials) into out, an f32 tensor of one element: a gradient norm's partial
// sum, NaN or infinite as soon as one element is.
MESHRT_API void sum_squares(Context& ctx, Stream& stream, const Tensor& x, const Tensor& out);
// out = x converted to out's dtype (any floating <-> floating; rounding to nearest even).
MESHRT_API void cast(Context& ctx, Stream& stream, const Tensor& x, const Tensor& out);
// Every element of out = value (floating and integer dtypes).
MESHRT_API void fill(Context& ctx, Stream& stream, const Tensor& out, double value);

// y = gelu(x + bias); x [..., n], bias [n] or null.
MESHRT_API void bias_gelu_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor* bias,
                              const Tensor& y, GeluKind kind = GeluKind::Tanh);
// dx = dy * gelu'(x + bias); dbias = sum of dx over rows (when given; requires bias's shape).
// dx may alias dy.
MESHRT_API void bias_gelu_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& x,
                              const Tensor* bias, const Tensor& dx, const Tensor* dbias,
                              GeluKind kind = GeluKind::Tanh, bool accumulate = false);

// Inverted dropout: y = x * keep / (1 - p). Element i of the tensor uses the Philox draw for
// global index index_base + i under (seed, offset), so the mask is reproducible from those alone
// and a shard starting at global element index_base sees the unsharded tensor's mask.
MESHRT_API void dropout_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& y, float p,
                            uint64_t seed, uint64_t offset, int64_t index_base = 0);
// dx = dy * keep / (1 - p), with the same mask as dropout_fwd for (seed, offset, index_base).
MESHRT_API void dropout_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& dx,
                            float p, uint64_t seed, uint64_t offset, int64_t index_base = 0);

// ---- normalisation (over the last dim; rows = all leading dims)
// ----------------------------------

// y = (x - mean) * rstd * gamma + beta; mean and rstd (f32, numel = rows) are saved for backward.
MESHRT_API void layernorm_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& gamma,
                              const Tensor* beta, const Tensor& y, const Tensor& mean,
                              const Tensor& rstd, float eps = 1e-5f);
MESHRT_API void layernorm_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& x,
                              const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dx, const Tensor* dgamma, const Tensor* dbeta,
                              bool accumulate = false);
// y = x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps) saved (f32, numel = rows).
MESHRT_API void rmsnorm_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& gamma,
                            const Tensor& y, const Tensor& rstd, float eps = 1e-6f);
MESHRT_API void rmsnorm_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& x,
                            const Tensor& gamma, const Tensor& rstd, const Tensor& dx,
                            const Tensor* dgamma, bool accumulate = false);

// ---- softmax and attention ----------------------------------------------------------------------

// y = softmax(scale * x) over the last dim.
MESHRT_API void softmax_rows_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& y,
                                 float scale = 1.f);
// dx = scale * y * (dy - sum(dy * y)) over the last dim.
MESHRT_API void softmax_rows_bwd(Context& ctx, Stream& stream, const Tensor& y, const Tensor& dy,
                                 const Tensor& dx, float scale = 1.f);

// Scaled dot-product attention, fused (no seq x seq matrix is materialised):
// q [batch, heads, seq_q, head_dim], k and v [batch, heads, seq_k, head_dim], out like q,
// lse [batch, heads, seq_q] f32 = logsumexp of each row of scaled scores (saved for backward).
// causal: query i sees keys j <= i (requires seq_q == seq_k).
MESHRT_API void attention_fwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse,
                              float softmax_scale, bool causal = true);
MESHRT_API void attention_bwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, float softmax_scale, bool causal = true);

// Attention of a query block over one K/V block of the same sequence, for context parallelism
// (dist/context_parallel.h): q [batch, heads, seq_q, head_dim] holds global positions
// [q_offset, q_offset + seq_q), k and v [batch, heads, seq_k, head_dim] hold
// [kv_offset, kv_offset + seq_k) (any lengths, offsets >= 0). causal: query position i sees key
// positions j <= i, so a K/V block wholly after the queries contributes nothing and one straddling
// them is masked in part. out and lse (f32 [batch, heads, seq_q]) are the block's partial result:
// a row that sees no key gets out 0 and lse -inf. attention_merge combines partials; the merge of
// every block's partial is attention_fwd over the whole sequence (within f32 rounding).
// Document masking (packed sequences): q_doc i32 [batch, seq_q] and k_doc i32 [batch, seq_k] give
// the document id of each query row and key position, non-decreasing along each row of each
// tensor (documents are runs of one id; ids are compared, not counted, and one numbering must
// span both tensors). A query then sees only the keys of its own document (and, causal, at or
// before its position): no length rule, a document may start or end anywhere in either block,
// and with offsets 0 and whole-sequence tensors this is doc-masked attention_fwd. A row that
// sees no key of the block gets out 0 and lse -inf, as above. Both undefined (the default): no
// document mask. Host backend only (other backends refuse it). Ids that decrease are refused
// when the work runs (the stream's synchronize() rethrows, naming the positions and ids).
MESHRT_API void attention_block_fwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    float softmax_scale, bool causal, int64_t q_offset,
                                    int64_t kv_offset, const Tensor& q_doc = {},
                                    const Tensor& k_doc = {});
// The backward of one block: out, dout and lse are the final (merged) forward's, over the whole
// sequence's keys. dq (overwritten) is this block's part of the query gradient (the sum over
// blocks is attention_bwd's dq); dk and dv (overwritten) are this block's keys' gradients from
// these queries (the sum over query blocks is attention_bwd's dk, dv). q_doc / k_doc as in the
// forward (the same ones).
MESHRT_API void attention_block_bwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& dout,
                                    const Tensor& lse, const Tensor& dq, const Tensor& dk,
                                    const Tensor& dv, float softmax_scale, bool causal,
                                    int64_t q_offset, int64_t kv_offset, const Tensor& q_doc = {},
                                    const Tensor& k_doc = {});
// Merges a partial result into another, in place: with m = max(lse, part_lse),
// out = (out e^(lse-m) + part_out e^(part_lse-m)) / (e^(lse-m) + e^(part_lse-m)) and
// lse = logaddexp(lse, part_lse). A side with lse -inf (empty) leaves the other exactly; both
// empty gives out 0, lse -inf. out and part_out [..., rows, head_dim] alike, lse and part_lse f32
// with one element per row.
MESHRT_API void attention_merge(Context& ctx, Stream& stream, const Tensor& out, const Tensor& lse,
                                const Tensor& part_out, const Tensor& part_lse);

// The CUDA backend has two attention kernels with the same contract (inputs, outputs, lse):
// - Flash: FlashAttention-2 on tensor cores (mma.sync, 16-bit inputs, f32 accumulation), for
//   bf16 / f16 with head_dim 64 or 128 (and 16-byte aligned tensors);
// - Reference: f32 math on CUDA cores, every floating dtype, head_dim <= 256; the cross-check.
// The setting starts as MESHRT_ATTENTION=flash|reference (default flash) and set_attention_kernel
// changes it for the process; Flash falls back to Reference where unsupported. The host backend
// has one kernel (the numerical reference of both) and ignores the setting.
enum class AttentionKernel : uint8_t { Flash, Reference };
MESHRT_API const char* attention_kernel_name(AttentionKernel k);
// "flash" | "reference"; throws meshrt::Error naming the value otherwise.
MESHRT_API AttentionKernel parse_attention_kernel(const std::string& name);
// The process-wide setting (MESHRT_ATTENTION, read on first use, unless set before).
MESHRT_API AttentionKernel attention_kernel();
MESHRT_API void set_attention_kernel(AttentionKernel k);
// The kernel the CUDA backend runs for this dtype and head_dim under `setting`.
MESHRT_API AttentionKernel cuda_attention_kernel(DType dtype, int64_t head_dim,
                                                 AttentionKernel setting = attention_kernel());

// ---- embedding ----------------------------------------------------------------------------------

// out[..., :] = weight[id - vocab_offset, :] for ids (i32/i64, any shape) inside this shard's
// rows [vocab_offset, vocab_offset + weight.rows); zero for ids outside (vocab-parallel: the
// shards' outputs are then summed). weight [v_local, d], out [ids..., d].
MESHRT_API void embedding_fwd(Context& ctx, Stream& stream, const Tensor& ids, const Tensor& weight,
                              const Tensor& out, int64_t vocab_offset = 0);
// dweight[id - vocab_offset] += dout[...] for ids in the shard (scatter-add; other rows zero
// unless accumulate).
MESHRT_API void embedding_bwd(Context& ctx, Stream& stream, const Tensor& ids, const Tensor& dout,
                              const Tensor& dweight, int64_t vocab_offset = 0,
                              bool accumulate = false);

// ---- vocab-parallel cross-entropy
// ---------------------------------------------------------------- logits [rows, v_local] hold
// vocabulary entries [vocab_offset, vocab_offset + v_local); targets [rows] i32/i64 are global ids;
// rows whose target is ignore_index have zero loss and gradient. The mesh layer combines the
// pieces: max -> all-reduce(max) -> sum-exp -> all-reduce(sum), target logit -> all-reduce(sum),
// then loss and gradient. All f32 [rows] statistics.

MESHRT_API void xent_row_max(Context& ctx, Stream& stream, const Tensor& logits,
                             const Tensor& row_max);
// sumexp = sum_j exp(logits[r, j] - row_max[r]) with the (global) row max.
MESHRT_API void xent_row_sumexp(Context& ctx, Stream& stream, const Tensor& logits,
                                const Tensor& row_max, const Tensor& sumexp);
// target_logit[r] = logits[r, targets[r] - vocab_offset] when in this shard, else 0.
MESHRT_API void xent_target_logit(Context& ctx, Stream& stream, const Tensor& logits,
                                  const Tensor& targets, const Tensor& target_logit,
                                  int64_t vocab_offset = 0, int64_t ignore_index = -100);
// loss[r] = log(sumexp[r]) + row_max[r] - target_logit[r] (0 for ignored rows).
MESHRT_API void xent_loss(Context& ctx, Stream& stream, const Tensor& row_max, const Tensor& sumexp,
                          const Tensor& target_logit, const Tensor& targets, const Tensor& loss,
                          int64_t ignore_index = -100);
// dlogits = grad_scale * (softmax(logits) - onehot(target)) over this shard (0 for ignored rows).
MESHRT_API void xent_grad(Context& ctx, Stream& stream, const Tensor& logits, const Tensor& row_max,
                          const Tensor& sumexp, const Tensor& targets, const Tensor& dlogits,
                          int64_t vocab_offset = 0, float grad_scale = 1.f,
                          int64_t ignore_index = -100);

// ---- optimizers (multi-tensor: one call updates every tensor of a group) ----------------------

struct MESHRT_API AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  int64_t step = 1;        // 1-based step number after this update (bias correction)
  float grad_scale = 1.f;  // gradients are multiplied by this first (e.g. 1 / loss scale)
};

// params[i] (f32/bf16/f16) updated in place from grads[i] (params[i]'s dtype or f32);
// exp_avg[i] and exp_avg_sq[i] are f32 states of the same shape. PyTorch AdamW semantics.
MESHRT_API void adamw_update(Context& ctx, Stream& stream, std::span<const Tensor> params,
                             std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
                             std::span<const Tensor> exp_avg_sq, const AdamWConfig& cfg);

struct MESHRT_API SgdConfig {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
  bool init_buffers = false;  // first step: momentum buffer = gradient (PyTorch)
  float grad_scale = 1.f;
};

// SGD with momentum (PyTorch semantics); momentum_bufs[i] f32, same shape as params[i].
MESHRT_API void sgd_momentum_update(Context& ctx, Stream& stream, std::span<const Tensor> params,
                                    std::span<const Tensor> grads,
                                    std::span<const Tensor> momentum_bufs, const SgdConfig& cfg);

// ---- introspection ------------------------------------------------------------------------------

// Host threads one rank's ops use (cores / local ranks, or MESHRT_HOST_THREADS).
MESHRT_API int host_threads(Context& ctx);

// Which path the host backend's 16-bit GEMMs take on this machine and why, e.g. "bf16: bf16
// matmul of oneDNN 2.6.3 (CPU ISA avx512_core_bf16), f32 accumulation; f16: ..." (decided once,
// at the first call, from the running CPU and MESHRT_HOST_BF16_GEMM).
MESHRT_API std::string host_gemm_16bit_info();

// The instruction-set variant of the host kernel loops in use and why, e.g. "avx2 (built:
// baseline, avx2, avx512; this CPU runs up to avx2)"; decided once, at the first host op, from the
// running CPU and MESHRT_HOST_ISA (auto, baseline, avx2 or avx512: the widest variant allowed).
MESHRT_API std::string host_isa_info();

// The vendor GEMM library of the CUDA backend, e.g. "cuBLASLt 13.0.2" (a library call: no GPU
// needed; loads libmeshrt-cuda.so in libmeshrt.so); "" in builds without CUDA or without the
// plugin.
MESHRT_API std::string gemm_library_version();

}  // namespace meshrt::ops
