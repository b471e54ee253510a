// Internal: the op table (one entry per public op of kernels/ops.h, with the dtypes it takes), the
// validated GEMM problem, and how a backend (host, cuda) is bound to it: per op, the function of
// the op's name in the backend's namespace.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

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

// A set of dtypes, one bit per DType.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> dts) {
    for (DType d : dts) bits_ |= bit(d);
  }
  constexpr bool contains(DType d) const { return (bits_ & bit(d)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr DTypeSet without(DTypeSet other) const {
    DTypeSet r;
    r.bits_ = bits_ & ~other.bits_;
    return r;
  }
  // "f32, bf16, f16"
  std::string str() const;

 private:
  static constexpr uint32_t bit(DType d) { return 1u << static_cast<unsigned>(d); }
  uint32_t bits_ = 0;
};
inline constexpr DTypeSet kFloating{DType::f32, DType::bf16, DType::f16};
inline constexpr DTypeSet kAnyDType{DType::f32, DType::bf16, DType::f16,
                                    DType::i32, DType::i64,  DType::u8};

// The op table: X(op, dtypes, backend parameters after (Context&, Stream&)). Each entry is one
// public op of kernels/ops.h with the same name and the dtypes every backend implements it for
// (the dtype its floating tensors share; the output's for fill); ops.cpp validates the call, then
// hands the backend these arguments (optional tensors as undefined Tensors, GEMM operands as a
// GemmProblem). A backend implements an op as a function of the op's name in its namespace
// (declared from this table by MESHRT_DECLARE_BACKEND_OPS) and registers nothing itself:
// MESHRT_BIND_BACKEND_OPS fills its table from these entries.
#define MESHRT_KERNEL_OPS(X)                                                                       \
  X(gemm, kFloating, const GemmProblem& p)                                                         \
  X(gemm_strided_batched, kFloating, const GemmProblem& p)                                         \
  X(add, kFloating, const Tensor& a, const Tensor& b, const Tensor& out, float alpha, float beta)  \
  X(scale, kFloating, const Tensor& x, const Tensor& out, float alpha)                             \
  X(sum_squares, kFloating, const Tensor& x, const Tensor& out)                                    \
  X(cast, kFloating, const Tensor& x, const Tensor& out)                                           \
  X(fill, kAnyDType, const Tensor& out, double value)                                              \
  X(bias_gelu_fwd, kFloating, const Tensor& x, const Tensor& bias, const Tensor& y,                \
    ops::GeluKind kind)                                                                            \
  X(bias_gelu_bwd, kFloating, const Tensor& dy, const Tensor& x, const Tensor& bias,               \
    const Tensor& dx, const Tensor& dbias, ops::GeluKind kind, bool accumulate)                    \
  X(dropout_fwd, kFloating, const Tensor& x, const Tensor& y, float p, uint64_t seed,              \
    uint64_t offset, int64_t index_base)                                                           \
  X(dropout_bwd, kFloating, const Tensor& dy, const Tensor& dx, float p, uint64_t seed,            \
    uint64_t offset, int64_t index_base)                                                           \
  X(layernorm_fwd, kFloating, const Tensor& x, const Tensor& gamma, const Tensor& beta,            \
    const Tensor& y, const Tensor& mean, const Tensor& rstd, float eps)                            \
  X(layernorm_bwd, kFloating, const Tensor& dy, const Tensor& x, const Tensor& gamma,              \
    const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,                \
    const Tensor& dbeta, bool accumulate)                                                          \
  X(rmsnorm_fwd, kFloating, const Tensor& x, const Tensor& gamma, const Tensor& y,                 \
    const Tensor& rstd, float eps)                                                                 \
  X(rmsnorm_bwd, kFloating, const Tensor& dy, const Tensor& x, const Tensor& gamma,                \
    const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, bool accumulate)                   \
  X(softmax_rows_fwd, kFloating, const Tensor& x, const Tensor& y, float scale)                    \
  X(softmax_rows_bwd, kFloating, const Tensor& y, const Tensor& dy, const Tensor& dx, float scale) \
  X(attention_fwd, kFloating, const Tensor& q, const Tensor& k, const Tensor& v,                   \
    const Tensor& out, const Tensor& lse, float scale, bool causal)                                \
  X(attention_bwd, kFloating, const Tensor& q, const Tensor& k, const Tensor& v,                   \
    const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk,  \
    const Tensor& dv, float scale, bool causal)                                                    \
  X(attention_block_fwd, kFloating, const Tensor& q, const Tensor& k, const Tensor& v,             \
    const Tensor& out, const Tensor& lse, float scale, bool causal, int64_t q_offset,              \
    int64_t kv_offset, const Tensor& q_doc, const Tensor& k_doc)                                   \
  X(attention_block_bwd, kFloating, const Tensor& q, const Tensor& k, const Tensor& v,             \
    const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk,  \
    const Tensor& dv, float scale, bool causal, int64_t q_offset, int64_t kv_offset,               \
    const Tensor& q_doc, const Tensor& k_doc)                                                      \
  X(attention_merge, kFloating, const Tensor& out, const Tensor& lse, const Tensor& part_out,      \
    const Tensor& part_lse)                                                                        \
  X(embedding_fwd, kFloating, const Tensor& ids, const Tensor& weight, const Tensor& out,          \
    int64_t vocab_offset)                                                                          \
  X(embedding_bwd, kFloating, const Tensor& ids, const Tensor& dout, const Tensor& dweight,        \
    int64_t vocab_offset, bool accumulate)                                                         \
  X(xent_row_max, kFloating, const Tensor& logits, const Tensor& row_max)                          \
  X(xent_row_sumexp, kFloating, const Tensor& logits, const Tensor& row_max, const Tensor& sumexp) \
  X(xent_target_logit, kFloating, const Tensor& logits, const Tensor& targets,                     \
    const Tensor& target_logit, int64_t vocab_offset, int64_t ignore_index)                        \
  X(xent_loss, kFloating, const Tensor& row_max, const Tensor& sumexp, const Tensor& target_logit, \
    const Tensor& targets, const Tensor& loss, int64_t ignore_index)                               \
  X(xent_grad, kFloating, const Tensor& logits, const Tensor& row_max, const Tensor& sumexp,       \
    const Tensor& targets, const Tensor& dlogits, int64_t vocab_offset, float grad_scale,          \
    int64_t ignore_index)                                                                          \
  X(adamw_update, kFloating, std::span<const Tensor> params, std::span<const Tensor> grads,        \
    std::span<const Tensor> exp_avg, std::span<const Tensor> exp_avg_sq,                           \
    const ops::AdamWConfig& cfg)                                                                   \
  X(sgd_momentum_update, kFloating, std::span<const Tensor> params, std::span<const Tensor> grads, \
    std::span<const Tensor> bufs, const ops::SgdConfig& cfg)

enum class Op : uint8_t {
#define MESHRT_OP_ENUM(op, dtypes_, ...) op,
  MESHRT_KERNEL_OPS(MESHRT_OP_ENUM)
#undef MESHRT_OP_ENUM
};
#define MESHRT_OP_COUNT(op, dtypes_, ...) +1
inline constexpr int kOpCount = 0 MESHRT_KERNEL_OPS(MESHRT_OP_COUNT);
#undef MESHRT_OP_COUNT

// "layernorm_fwd": the public op's name.
const char* op_name(Op op);

// One backend's implementation of the op table (filled by MESHRT_BIND_BACKEND_OPS). An op the
// backend lacks keeps a null entry and an empty dtype set: calling it is a clear error
// (require_support), not a link failure.
struct OpTable {
  explicit OpTable(const char* backend_name) : name(backend_name) {}
  const char* name;
#define MESHRT_OP_ENTRY(op, dtypes_, ...) void (*op)(Context&, Stream&, __VA_ARGS__) = nullptr;
  MESHRT_KERNEL_OPS(MESHRT_OP_ENTRY)
#undef MESHRT_OP_ENTRY
  DTypeSet dtypes[kOpCount];

  // Whether `op` is implemented for tensors of `dtype` (the dtype its floating tensors share;
  // the output's for fill).
  bool supports(Op op, DType dtype) const { return dtypes[static_cast<int>(op)].contains(dtype); }
};

// Throws meshrt::Error naming the op, the dtype and the backend unless be.supports(op, dtype).
void require_support(const OpTable& be, Op op, DType dtype);

// The dtypes the op table declares for `op`.
constexpr DTypeSet table_dtypes(Op op) {
  switch (op) {
#define MESHRT_OP_DTYPES(op, dtypes_, ...) \
  case Op::op:                             \
    return dtypes_;
    MESHRT_KERNEL_OPS(MESHRT_OP_DTYPES)
#undef MESHRT_OP_DTYPES
  }
  return {};
}

}  // namespace meshrt::kernels

// Declares, in the backend's namespace, the function implementing each op: `void op(Context&,
// Stream&, <the table's parameters>)`. host/isa.h expands it in each instruction-set variant's
// namespace, this header in meshrt::kernels::cuda.
#define MESHRT_DECLARE_OP_IMPL(op, dtypes_, ...) void op(Context&, Stream&, __VA_ARGS__);
#define MESHRT_DECLARE_BACKEND_OPS MESHRT_KERNEL_OPS(MESHRT_DECLARE_OP_IMPL)

// Fills `OpTable& b` from the op table with the functions of the namespace it is expanded in, each
// for the table's dtypes less `gaps(Op)` (a constexpr function of that namespace: the dtypes the
// backend does not implement an op for). An op whose dtypes are all gaps is not referenced at all
// (a discarded `if constexpr` branch), so a backend without it links, and calls fail naming op,
// dtype and backend (require_support).
#define MESHRT_BIND_OP_IMPL(op, dtypes_, ...)                           \
  if constexpr (constexpr ::meshrt::kernels::DTypeSet have_ =           \
                    (dtypes_).without(gaps(::meshrt::kernels::Op::op)); \
                !have_.empty()) {                                       \
    b.op = &op;                                                         \
    b.dtypes[static_cast<int>(::meshrt::kernels::Op::op)] = have_;      \
  }
#define MESHRT_BIND_BACKEND_OPS MESHRT_KERNEL_OPS(MESHRT_BIND_OP_IMPL)

namespace meshrt::kernels::host {
enum class HostIsa { baseline, avx2, avx512 };
// "baseline" (x86-64: SSE2), "avx2" (x86-64-v3: AVX2, FMA, F16C), "avx512" (x86-64-v4).
const char* host_isa_name(HostIsa isa);
// Reads a MESHRT_HOST_ISA value (one of the names above, or "auto": no cap); throws naming the
// accepted values otherwise.
HostIsa parse_host_isa_cap(const char* value);
// Whether this binary has the variant, and whether the running CPU can run it.
bool host_isa_built(HostIsa isa);
bool host_isa_runs_here(HostIsa isa);
// The widest variant that is built, runs here and is not above `cap`.
HostIsa choose_host_isa(HostIsa cap);
// The variant the host backend uses: choose_host_isa(MESHRT_HOST_ISA, or no cap), decided once.
HostIsa host_isa();
// The host backend: the op table of host_isa()'s variant.
const OpTable& backend();
// The op table of one variant (tests compare them); throws when it is not built or does not run
// on this CPU.
const OpTable& backend(HostIsa isa);
}  // namespace meshrt::kernels::host

#if defined(MESHRT_WITH_CUDA)
namespace meshrt::kernels::cuda {
const OpTable& backend();
MESHRT_DECLARE_BACKEND_OPS
}  // namespace meshrt::kernels::cuda
#endif
