// Internal: the validated op arguments and the functions each backend (host, cuda) implements.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/ops.h"

namespace meshrt::kernels {

// A validated (batched) GEMM in row-major BLAS terms: C[m, n] = alpha * op(A) op(B) + beta * C
// (+ bias[n]), where A is stored with leading dimension lda (rows of the stored matrix are lda
// elements apart), likewise B and C; trans_* already include flips for transposed-view inputs.
struct GemmProblem {
  Tensor a, b, c, bias;  // bias undefined when absent
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  float alpha = 1.f, beta = 0.f;
};

// rows x cols view of a contiguous tensor over its last dim.
inline int64_t row_len(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(-1); }
inline int64_t row_count(const Tensor& t) {
  int64_t n = row_len(t);
  return n == 0 ? 0 : t.numel() / n;
}

}  // namespace meshrt::kernels

// Every backend provides these, called by ops.cpp after validation (same meaning as ops.h).
#define MESHRT_BACKEND_DECLS                                                                      \
  void gemm(Context& ctx, Stream& s, const GemmProblem& p);                                       \
  void add(Context& ctx, Stream& s, const Tensor& a, const Tensor& b, const Tensor& out,          \
           float alpha, float beta);                                                              \
  void cast(Context& ctx, Stream& s, const Tensor& x, const Tensor& out);                         \
  void fill(Context& ctx, Stream& s, const Tensor& out, double value);                            \
  void bias_gelu_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& bias,                \
                     const Tensor& y, ops::GeluKind kind);                                        \
  void bias_gelu_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x,                  \
                     const Tensor& bias, const Tensor& dx, const Tensor& dbias,                   \
                     ops::GeluKind kind, bool accumulate);                                        \
  void dropout(Context& ctx, Stream& s, const Tensor& x, const Tensor& y, float p, uint64_t seed, \
               uint64_t offset, int64_t index_base);                                              \
  void layernorm_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& gamma,               \
                     const Tensor& beta, const Tensor& y, const Tensor& mean, const Tensor& rstd, \
                     float eps, bool rms);                                                        \
  void layernorm_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x,                  \
                     const Tensor& gamma, const Tensor& mean, const Tensor& rstd,                 \
                     const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, bool rms,       \
                     bool accumulate);                                                            \
  void softmax_rows_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& y, float scale);  \
  void softmax_rows_bwd(Context& ctx, Stream& s, const Tensor& y, const Tensor& dy,               \
                        const Tensor& dx, float scale);                                           \
  void attention_fwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,  \
                     const Tensor& out, const Tensor& lse, float scale, bool causal);             \
  void attention_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,  \
                     const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,  \
                     const Tensor& dk, const Tensor& dv, float scale, bool causal);               \
  void embedding_fwd(Context& ctx, Stream& s, const Tensor& ids, const Tensor& weight,            \
                     const Tensor& out, int64_t vocab_offset);                                    \
  void embedding_bwd(Context& ctx, Stream& s, const Tensor& ids, const Tensor& dout,              \
                     const Tensor& dweight, int64_t vocab_offset, bool accumulate);               \
  void xent_row_max(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max);        \
  void xent_row_sumexp(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max,      \
                       const Tensor& sumexp);                                                     \
  void xent_target_logit(Context& ctx, Stream& s, const Tensor& logits, const Tensor& targets,    \
                         const Tensor& target_logit, int64_t vocab_offset, int64_t ignore_index); \
  void xent_loss(Context& ctx, Stream& s, const Tensor& row_max, const Tensor& sumexp,            \
                 const Tensor& target_logit, const Tensor& targets, const Tensor& loss,           \
                 int64_t ignore_index);                                                           \
  void xent_grad(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max,            \
                 const Tensor& sumexp, const Tensor& targets, const Tensor& dlogits,              \
                 int64_t vocab_offset, float grad_scale, int64_t ignore_index);                   \
  void adamw_update(Context& ctx, Stream& s, std::span<const Tensor> params,                      \
                    std::span<const Tensor> grads, std::span<const Tensor> exp_avg,               \
                    std::span<const Tensor> exp_avg_sq, const ops::AdamWConfig& cfg);             \
  void sgd_momentum_update(Context& ctx, Stream& s, std::span<const Tensor> params,               \
                           std::span<const Tensor> grads, std::span<const Tensor> bufs,           \
                           const ops::SgdConfig& cfg);

namespace meshrt::kernels::host {
MESHRT_BACKEND_DECLS
}  // namespace meshrt::kernels::host

#if defined(MESHRT_WITH_CUDA)
namespace meshrt::kernels::cuda {
MESHRT_BACKEND_DECLS
}  // namespace meshrt::kernels::cuda
#endif
