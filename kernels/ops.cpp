// Validation of every op's arguments and dispatch to the host or CUDA backend.
#include "kernels/ops.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "runtime/cuda_plugin.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/ranges.h"

namespace meshrt::kernels {

const char* op_name(Op op) {
  switch (op) {
#define MESHRT_OP_NAME(op, ...) \
  case Op::op:                  \
    return #op;
    MESHRT_KERNEL_OPS(MESHRT_OP_NAME)
#undef MESHRT_OP_NAME
  }
  return "?";
}

std::string DTypeSet::str() const {
  std::string out;
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    if (!contains(d)) continue;
    if (!out.empty()) out += ", ";
    out += dtype_name(d);
  }
  return out;
}

void require_support(const OpTable& be, Op op, DType dtype) {
  if (be.supports(op, dtype)) return;
  const DTypeSet& have = be.dtypes[static_cast<int>(op)];
  MESHRT_CHECK(!have.empty(), "op " << op_name(op) << ": the " << be.name
                                    << " backend does not implement it (called with dtype "
                                    << dtype_name(dtype) << ")");
  MESHRT_FAIL("op " << op_name(op) << ": the " << be.name << " backend does not support dtype "
                    << dtype_name(dtype) << " (it supports " << have.str() << ")");
}

}  // namespace meshrt::kernels

namespace meshrt::ops {

using kernels::GemmProblem;
using kernels::row_count;
using kernels::row_len;

const char* gelu_kind_name(GeluKind k) { return k == GeluKind::Tanh ? "tanh" : "erf"; }

namespace {

// Argument checks for one op call; every message starts with "op <name>:".
class Check {
 public:
  Check(const char* op, const Context& ctx, Stream& s) : op_(op), dev_(s.device()) {
    MESHRT_CHECK(ctx.device() == dev_, "op " << op_ << ": the stream is on " << dev_.str()
                                             << " but the context is for " << ctx.device().str());
  }
  const char* op() const { return op_; }
  Device device() const { return dev_; }

  void tensor(const Tensor& t, const char* name) const {
    MESHRT_CHECK(t.defined(), "op " << op_ << ": " << name << " is an undefined tensor");
    MESHRT_CHECK(t.device() == dev_, "op " << op_ << ": " << name << " " << t.str()
                                           << " is not on the stream's device " << dev_.str());
  }
  void contiguous(const Tensor& t, const char* name) const {
    tensor(t, name);
    // Empty tensors count as contiguous (Tensor::is_contiguous says no for e.g. [4, 0]).
    MESHRT_CHECK(t.numel() == 0 || t.is_contiguous(),
                 "op " << op_ << ": " << name << " " << t.str() << " must be contiguous (strides "
                       << t.strides().str() << "); call contiguous() first");
  }
  void floating(const Tensor& t, const char* name) const {
    contiguous(t, name);
    MESHRT_CHECK(is_floating(t.dtype()),
                 "op " << op_ << ": " << name << " " << t.str() << " must be f32, bf16 or f16");
  }
  void index(const Tensor& t, const char* name) const {
    contiguous(t, name);
    MESHRT_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64,
                 "op " << op_ << ": " << name << " " << t.str() << " must be i32 or i64");
  }
  void f32(const Tensor& t, const char* name) const {
    contiguous(t, name);
    MESHRT_CHECK(t.dtype() == DType::f32,
                 "op " << op_ << ": " << name << " " << t.str() << " must be f32");
  }
  void same_dtype(const Tensor& a, const char* an, const Tensor& b, const char* bn) const {
    MESHRT_CHECK(a.dtype() == b.dtype(), "op " << op_ << ": dtype mismatch: " << an << " "
                                               << a.str() << " vs " << bn << " " << b.str());
  }
  void same_shape(const Tensor& a, const char* an, const Tensor& b, const char* bn) const {
    MESHRT_CHECK(a.shape() == b.shape(), "op " << op_ << ": shape mismatch: " << an << " "
                                               << a.str() << " vs " << bn << " " << b.str());
  }
  // a and b both floating, same dtype and shape.
  void like(const Tensor& a, const char* an, const Tensor& b, const char* bn) const {
    floating(b, bn);
    same_dtype(a, an, b, bn);
    same_shape(a, an, b, bn);
  }
  void numel(const Tensor& t, const char* name, int64_t n, const char* what) const {
    MESHRT_CHECK(t.numel() == n, "op " << op_ << ": " << name << " " << t.str() << " must have "
                                       << n << " elements (" << what << ")");
  }
  // A per-feature vector: 1-D [n] of the given dtype.
  void vec(const Tensor& t, const char* name, int64_t n, DType dt, const Tensor& ref,
           const char* refname) const {
    floating(t, name);
    MESHRT_CHECK(t.ndim() == 1 && t.size(0) == n, "op " << op_ << ": " << name << " " << t.str()
                                                        << " must be [" << n << "] (last dim of "
                                                        << refname << " " << ref.str() << ")");
    MESHRT_CHECK(t.dtype() == dt, "op " << op_ << ": dtype mismatch: " << name << " " << t.str()
                                        << " vs " << refname << " " << ref.str());
  }
  void rows_stat(const Tensor& t, const char* name, const Tensor& x) const {
    f32(t, name);
    numel(t, name, row_count(x), "one per row of x");
  }

 private:
  const char* op_;
  Device dev_;
};

bool is_cpu(const Check& c) { return c.device().is_cpu(); }

// The backend for the op's device: the host's, or the CUDA backend's op table (linked in, or
// loaded from libmeshrt-cuda.so: runtime/cuda_plugin.h).
const kernels::OpTable& backend_of(const Check& c) {
  if (is_cpu(c)) return kernels::host::backend();
  std::string why;
  const detail::CudaPlugin* cuda = detail::cuda_plugin(&why);
  MESHRT_CHECK(cuda != nullptr,
               "op " << c.op() << ": tensors are on " << c.device().str() << " but " << why);
  return *static_cast<const kernels::OpTable*>(cuda->kernels);
}

// Runs op `name` of the device's backend, which must support `dtype`.
#define MESHRT_RUN(chk, name, dtype, ...)                    \
  do {                                                       \
    const kernels::OpTable& be_ = backend_of(chk);           \
    kernels::require_support(be_, kernels::Op::name, dtype); \
    be_.name(__VA_ARGS__);                                   \
  } while (0)

const Tensor& opt(const Tensor* t) {
  static const Tensor kNone;
  return t ? *t : kNone;
}

// ---- GEMM operand layouts -----------------------------------------------------------------------

struct MatLayout {
  int64_t rows = 0, cols = 0;  // of the logical matrix (before op())
  int64_t ld = 0;              // leading dimension of the stored matrix
  bool transposed = false;     // stored as the row-major transpose (a transposed 2-D view)
  int64_t batch = 1;
  int64_t batch_stride = 0;
};

std::string strides_str(const Tensor& t) { return t.strides().str(); }

// Collapses dims [0, end) into one index with a uniform stride; returns false if impossible.
bool collapse(const Tensor& t, int end, int64_t* count, int64_t* stride) {
  *count = 1;
  *stride = 0;
  bool have = false;
  int64_t expect = 0;
  for (int i = end - 1; i >= 0; --i) {
    int64_t d = t.shape()[i];
    *count *= d;
    if (d == 1) continue;
    if (!have) {
      *stride = t.strides()[i];
      expect = t.strides()[i] * d;
      have = true;
    } else {
      if (t.strides()[i] != expect) return false;
      expect = t.strides()[i] * d;
    }
  }
  return true;
}

// Matrix view of a GEMM operand: the last two dims (batched) or all dims flattened into rows.
MatLayout mat_layout(const Check& chk, const Tensor& t, const char* name, bool batched) {
  chk.tensor(t, name);
  MESHRT_CHECK(is_floating(t.dtype()),
               "op " << chk.op() << ": " << name << " " << t.str() << " must be f32, bf16 or f16");
  int nd = t.ndim();
  MESHRT_CHECK(nd >= (batched ? 3 : 2), "op " << chk.op() << ": " << name << " " << t.str()
                                              << " must have at least " << (batched ? 3 : 2)
                                              << " dims");
  MatLayout L;
  const Shape& st = t.strides();
  L.cols = t.shape()[nd - 1];
  int64_t inner_stride = st[nd - 1];
  bool ok_batch = true;
  if (batched) {
    L.rows = t.shape()[nd - 2];
    ok_batch = collapse(t, nd - 2, &L.batch, &L.batch_stride);
    int64_t rstride = st[nd - 2];
    if ((L.cols <= 1 || inner_stride == 1) && (L.rows <= 1 || rstride >= L.cols)) {
      L.ld = L.rows <= 1 ? std::max<int64_t>(L.cols, 1) : rstride;
    } else if ((L.rows <= 1 || rstride == 1) && (L.cols <= 1 || inner_stride >= L.rows)) {
      L.transposed = true;
      L.ld = L.cols <= 1 ? std::max<int64_t>(L.rows, 1) : inner_stride;
    } else {
      L.ld = -1;
    }
  } else {
    int64_t rstride = 0;
    bool ok_rows = collapse(t, nd - 1, &L.rows, &rstride);
    if (ok_rows && (L.cols <= 1 || inner_stride == 1) && (L.rows <= 1 || rstride >= L.cols)) {
      L.ld = L.rows <= 1 ? std::max<int64_t>(L.cols, 1) : rstride;
    } else if (nd == 2 && (L.rows <= 1 || st[0] == 1) && (L.cols <= 1 || inner_stride >= L.rows)) {
      L.transposed = true;
      L.ld = L.cols <= 1 ? std::max<int64_t>(L.rows, 1) : inner_stride;
    } else {
      L.ld = -1;
    }
  }
  MESHRT_CHECK(L.ld >= 0 && ok_batch,
               "op " << chk.op() << ": " << name << " " << t.str() << " with strides "
                     << strides_str(t)
                     << " is neither a row-major matrix (unit stride on the last dim, rows "
                        "evenly spaced) nor a transposed 2-D view; make it contiguous first");
  return L;
}

GemmProblem make_gemm(const Check& chk, const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, const Tensor& c, float alpha, float beta, const Tensor* bias,
                      bool batched) {
  MatLayout la = mat_layout(chk, a, "a", batched);
  MatLayout lb = mat_layout(chk, b, "b", batched);
  MatLayout lc = mat_layout(chk, c, "c", batched);
  MESHRT_CHECK(!lc.transposed, "op " << chk.op() << ": c " << c.str() << " with strides "
                                     << strides_str(c)
                                     << " must be row-major (unit stride on "
                                        "its last dim)");
  chk.same_dtype(a, "a", b, "b");
  MESHRT_CHECK(
      c.dtype() == a.dtype() || c.dtype() == DType::f32,
      "op " << chk.op() << ": c " << c.str() << " must have a's dtype (" << a.str() << ") or f32");
  int64_t m = trans_a ? la.cols : la.rows;
  int64_t ka = trans_a ? la.rows : la.cols;
  int64_t kb = trans_b ? lb.cols : lb.rows;
  int64_t n = trans_b ? lb.rows : lb.cols;
  auto describe = [&]() {
    std::ostringstream os;
    os << "a " << a.str() << (trans_a ? " (transposed)" : "") << ", b " << b.str()
       << (trans_b ? " (transposed)" : "") << ", c " << c.str();
    return os.str();
  };
  MESHRT_CHECK(ka == kb, "op " << chk.op() << ": inner dims differ: op(a) is [" << m << ", " << ka
                               << "] but op(b) is [" << kb << ", " << n << "]; " << describe());
  MESHRT_CHECK(lc.rows == m && lc.cols == n, "op " << chk.op() << ": c must be [" << m << ", " << n
                                                   << "] (flattened) but is [" << lc.rows << ", "
                                                   << lc.cols << "]; " << describe());
  if (batched) {
    MESHRT_CHECK(la.batch == lc.batch && lb.batch == lc.batch,
                 "op " << chk.op() << ": batch counts differ (a " << la.batch << ", b " << lb.batch
                       << ", c " << lc.batch << "); " << describe());
  }
  GemmProblem p;
  p.a = a;
  p.b = b;
  p.c = c;
  p.m = m;
  p.n = n;
  p.k = ka;
  // A transposed view is the row-major transpose of what is stored: flip the op.
  p.trans_a = trans_a != la.transposed;
  p.trans_b = trans_b != lb.transposed;
  p.lda = la.ld;
  p.ldb = lb.ld;
  p.ldc = lc.ld;
  p.batch = lc.batch;
  p.stride_a = la.batch_stride;
  p.stride_b = lb.batch_stride;
  p.stride_c = lc.batch_stride;
  p.alpha = alpha;
  p.beta = beta;
  if (bias) {
    MESHRT_CHECK(!batched, "op " << chk.op() << ": bias is not supported for batched GEMM");
    chk.vec(*bias, "bias", n, c.dtype(), c, "c");
    p.bias = *bias;
  }
  return p;
}

}  // namespace

// ---- GEMM ---------------------------------------------------------------------------------------

namespace {
// "gemm 512x3072x1024" (m x n x k): the profiler range of a GEMM (Nsight shows it around the
// kernel; tests compare the blocks' GEMMs with model/block_desc.h through a ranges observer).
std::string gemm_range_name(const GemmProblem& p) {
  std::string s = "gemm ";
  s += std::to_string(p.m);
  s += 'x';
  s += std::to_string(p.n);
  s += 'x';
  s += std::to_string(p.k);
  return s;
}
}  // namespace

void gemm(Context& ctx, Stream& stream, const Tensor& a, bool trans_a, const Tensor& b,
          bool trans_b, const Tensor& c, float alpha, float beta, const Tensor* bias) {
  Check chk("gemm", ctx, stream);
  GemmProblem p = make_gemm(chk, a, trans_a, b, trans_b, c, alpha, beta, bias, false);
  if (p.m == 0 || p.n == 0) return;
  std::optional<ranges::Scoped> range;
  if (ranges::enabled())
    range.emplace(gemm_range_name(p), static_cast<uint64_t>(2 * p.m * p.n * p.k));
  MESHRT_RUN(chk, gemm, a.dtype(), ctx, stream, p);
}

void gemm_strided_batched(Context& ctx, Stream& stream, const Tensor& a, bool trans_a,
                          const Tensor& b, bool trans_b, const Tensor& c, float alpha, float beta) {
  Check chk("gemm_strided_batched", ctx, stream);
  GemmProblem p = make_gemm(chk, a, trans_a, b, trans_b, c, alpha, beta, nullptr, true);
  if (p.m == 0 || p.n == 0 || p.batch == 0) return;
  MESHRT_RUN(chk, gemm_strided_batched, a.dtype(), ctx, stream, p);
}

// ---- elementwise --------------------------------------------------------------------------------

void add(Context& ctx, Stream& stream, const Tensor& a, const Tensor& b, const Tensor& out,
         float alpha, float beta) {
  Check chk("add", ctx, stream);
  chk.floating(a, "a");
  chk.like(a, "a", b, "b");
  chk.like(a, "a", out, "out");
  if (out.numel() == 0) return;
  MESHRT_RUN(chk, add, a.dtype(), ctx, stream, a, b, out, alpha, beta);
}

void scale(Context& ctx, Stream& stream, const Tensor& x, const Tensor& out, float alpha) {
  Check chk("scale", ctx, stream);
  chk.floating(x, "x");
  chk.like(x, "x", out, "out");
  if (out.numel() == 0) return;
  MESHRT_RUN(chk, scale, x.dtype(), ctx, stream, x, out, alpha);
}

void sum_squares(Context& ctx, Stream& stream, const Tensor& x, const Tensor& out) {
  Check chk("sum_squares", ctx, stream);
  chk.floating(x, "x");
  chk.contiguous(x, "x");
  chk.f32(out, "out");
  MESHRT_CHECK(out.numel() == 1, "sum_squares: out " << out.str() << " must hold one element");
  if (x.numel() == 0) return;
  MESHRT_RUN(chk, sum_squares, x.dtype(), ctx, stream, x, out);
}

void cast(Context& ctx, Stream& stream, const Tensor& x, const Tensor& out) {
  Check chk("cast", ctx, stream);
  chk.floating(x, "x");
  chk.floating(out, "out");
  chk.same_shape(x, "x", out, "out");
  if (out.numel() == 0) return;
  MESHRT_RUN(chk, cast, x.dtype(), ctx, stream, x, out);
}

void fill(Context& ctx, Stream& stream, const Tensor& out, double value) {
  Check chk("fill", ctx, stream);
  chk.contiguous(out, "out");
  if (out.numel() == 0) return;
  MESHRT_RUN(chk, fill, out.dtype(), ctx, stream, out, value);
}

void bias_gelu_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor* bias,
                   const Tensor& y, GeluKind kind) {
  Check chk("bias_gelu_fwd", ctx, stream);
  chk.floating(x, "x");
  chk.like(x, "x", y, "y");
  if (bias) chk.vec(*bias, "bias", row_len(x), x.dtype(), x, "x");
  if (x.numel() == 0) return;
  MESHRT_RUN(chk, bias_gelu_fwd, x.dtype(), ctx, stream, x, opt(bias), y, kind);
}

void bias_gelu_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& x,
                   const Tensor* bias, const Tensor& dx, const Tensor* dbias, GeluKind kind,
                   bool accumulate) {
  Check chk("bias_gelu_bwd", ctx, stream);
  chk.floating(x, "x");
  chk.like(x, "x", dy, "dy");
  chk.like(x, "x", dx, "dx");
  if (bias) chk.vec(*bias, "bias", row_len(x), x.dtype(), x, "x");
  if (dbias) {
    MESHRT_CHECK(bias != nullptr, "op bias_gelu_bwd: dbias given but bias is null");
    chk.vec(*dbias, "dbias", row_len(x), x.dtype(), x, "x");
  }
  if (x.numel() == 0 && !dbias) return;
  MESHRT_RUN(chk, bias_gelu_bwd, x.dtype(), ctx, stream, dy, x, opt(bias), dx, opt(dbias), kind,
             accumulate);
}

namespace {
void check_dropout(const Check& chk, const Tensor& x, const char* xn, const Tensor& y,
                   const char* yn, float p, int64_t index_base) {
  chk.floating(x, xn);
  chk.like(x, xn, y, yn);
  MESHRT_CHECK(p >= 0.f && p < 1.f,
               "op " << chk.op() << ": dropout probability p=" << p << " must be in [0, 1)");
  MESHRT_CHECK(index_base >= 0,
               "op " << chk.op() << ": index_base=" << index_base << " must be >= 0");
}
}  // namespace

void dropout_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& y, float p,
                 uint64_t seed, uint64_t offset, int64_t index_base) {
  Check chk("dropout_fwd", ctx, stream);
  check_dropout(chk, x, "x", y, "y", p, index_base);
  if (x.numel() == 0) return;
  MESHRT_RUN(chk, dropout_fwd, x.dtype(), ctx, stream, x, y, p, seed, offset, index_base);
}

void dropout_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& dx, float p,
                 uint64_t seed, uint64_t offset, int64_t index_base) {
  Check chk("dropout_bwd", ctx, stream);
  check_dropout(chk, dy, "dy", dx, "dx", p, index_base);
  if (dy.numel() == 0) return;
  MESHRT_RUN(chk, dropout_bwd, dy.dtype(), ctx, stream, dy, dx, p, seed, offset, index_base);
}

// ---- normalisation ------------------------------------------------------------------------------

namespace {
void check_norm_fwd(const Check& chk, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                    const Tensor& y, const Tensor* mean, const Tensor& rstd, float eps) {
  chk.floating(x, "x");
  MESHRT_CHECK(x.ndim() >= 1 && row_len(x) > 0,
               "op " << chk.op() << ": x " << x.str() << " must have a non-empty last dim");
  chk.like(x, "x", y, "y");
  chk.vec(gamma, "gamma", row_len(x), x.dtype(), x, "x");
  if (beta) chk.vec(*beta, "beta", row_len(x), x.dtype(), x, "x");
  if (mean) chk.rows_stat(*mean, "mean", x);
  chk.rows_stat(rstd, "rstd", x);
  MESHRT_CHECK(eps >= 0.f && std::isfinite(eps),
               "op " << chk.op() << ": eps=" << eps << " must be finite and >= 0");
}
void check_norm_bwd(const Check& chk, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                    const Tensor* mean, const Tensor& rstd, const Tensor& dx, const Tensor* dgamma,
                    const Tensor* dbeta) {
  chk.floating(x, "x");
  MESHRT_CHECK(x.ndim() >= 1 && row_len(x) > 0,
               "op " << chk.op() << ": x " << x.str() << " must have a non-empty last dim");
  chk.like(x, "x", dy, "dy");
  chk.like(x, "x", dx, "dx");
  chk.vec(gamma, "gamma", row_len(x), x.dtype(), x, "x");
  if (mean) chk.rows_stat(*mean, "mean", x);
  chk.rows_stat(rstd, "rstd", x);
  if (dgamma) chk.vec(*dgamma, "dgamma", row_len(x), x.dtype(), x, "x");
  if (dbeta) chk.vec(*dbeta, "dbeta", row_len(x), x.dtype(), x, "x");
}
}  // namespace

void layernorm_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& gamma,
                   const Tensor* beta, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                   float eps) {
  Check chk("layernorm_fwd", ctx, stream);
  check_norm_fwd(chk, x, gamma, beta, y, &mean, rstd, eps);
  if (x.numel() == 0) return;
  MESHRT_RUN(chk, layernorm_fwd, x.dtype(), ctx, stream, x, gamma, opt(beta), y, mean, rstd, eps);
}

void layernorm_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& x,
                   const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                   const Tensor* dgamma, const Tensor* dbeta, bool accumulate) {
  Check chk("layernorm_bwd", ctx, stream);
  check_norm_bwd(chk, dy, x, gamma, &mean, rstd, dx, dgamma, dbeta);
  MESHRT_RUN(chk, layernorm_bwd, x.dtype(), ctx, stream, dy, x, gamma, mean, rstd, dx, opt(dgamma),
             opt(dbeta), accumulate);
}

void rmsnorm_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& gamma,
                 const Tensor& y, const Tensor& rstd, float eps) {
  Check chk("rmsnorm_fwd", ctx, stream);
  check_norm_fwd(chk, x, gamma, nullptr, y, nullptr, rstd, eps);
  if (x.numel() == 0) return;
  MESHRT_RUN(chk, rmsnorm_fwd, x.dtype(), ctx, stream, x, gamma, y, rstd, eps);
}

void rmsnorm_bwd(Context& ctx, Stream& stream, const Tensor& dy, const Tensor& x,
                 const Tensor& gamma, const Tensor& rstd, const Tensor& dx, const Tensor* dgamma,
                 bool accumulate) {
  Check chk("rmsnorm_bwd", ctx, stream);
  check_norm_bwd(chk, dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr);
  MESHRT_RUN(chk, rmsnorm_bwd, x.dtype(), ctx, stream, dy, x, gamma, rstd, dx, opt(dgamma),
             accumulate);
}

// ---- softmax and attention ----------------------------------------------------------------------

void softmax_rows_fwd(Context& ctx, Stream& stream, const Tensor& x, const Tensor& y, float scale) {
  Check chk("softmax_rows_fwd", ctx, stream);
  chk.floating(x, "x");
  chk.like(x, "x", y, "y");
  if (x.numel() == 0) return;
  MESHRT_RUN(chk, softmax_rows_fwd, x.dtype(), ctx, stream, x, y, scale);
}

void softmax_rows_bwd(Context& ctx, Stream& stream, const Tensor& y, const Tensor& dy,
                      const Tensor& dx, float scale) {
  Check chk("softmax_rows_bwd", ctx, stream);
  chk.floating(y, "y");
  chk.like(y, "y", dy, "dy");
  chk.like(y, "y", dx, "dx");
  if (y.numel() == 0) return;
  MESHRT_RUN(chk, softmax_rows_bwd, y.dtype(), ctx, stream, y, dy, dx, scale);
}

namespace {
void check_attention(const Check& chk, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& out, const Tensor& lse, float scale, bool causal) {
  chk.floating(q, "q");
  MESHRT_CHECK(q.ndim() == 4,
               "op " << chk.op() << ": q " << q.str() << " must be [batch, heads, seq, head_dim]");
  chk.floating(k, "k");
  chk.same_dtype(q, "q", k, "k");
  MESHRT_CHECK(
      k.ndim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
      "op " << chk.op() << ": k " << k.str() << " must be [" << q.size(0) << ", " << q.size(1)
            << ", seq_k, " << q.size(3) << "] to match q " << q.str());
  chk.like(k, "k", v, "v");
  chk.like(q, "q", out, "out");
  chk.f32(lse, "lse");
  MESHRT_CHECK(lse.ndim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) &&
                   lse.size(2) == q.size(2),
               "op " << chk.op() << ": lse " << lse.str() << " must be [" << q.size(0) << ", "
                     << q.size(1) << ", " << q.size(2) << "] for q " << q.str());
  MESHRT_CHECK(!causal || q.size(2) == k.size(2),
               "op " << chk.op() << ": causal attention needs seq_q == seq_k, got q " << q.str()
                     << " and k " << k.str());
  MESHRT_CHECK(std::isfinite(scale) && scale > 0.f,
               "op " << chk.op() << ": softmax_scale=" << scale << " must be finite and > 0");
}
}  // namespace

void attention_fwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, float softmax_scale, bool causal) {
  Check chk("attention_fwd", ctx, stream);
  check_attention(chk, q, k, v, out, lse, softmax_scale, causal);
  if (q.numel() == 0) return;
  MESHRT_RUN(chk, attention_fwd, q.dtype(), ctx, stream, q, k, v, out, lse, softmax_scale, causal);
}

void attention_bwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv, float softmax_scale, bool causal) {
  Check chk("attention_bwd", ctx, stream);
  check_attention(chk, q, k, v, out, lse, softmax_scale, causal);
  chk.like(q, "q", dout, "dout");
  chk.like(q, "q", dq, "dq");
  chk.like(k, "k", dk, "dk");
  chk.like(k, "k", dv, "dv");
  if (q.numel() == 0 && k.numel() == 0) return;
  MESHRT_RUN(chk, attention_bwd, q.dtype(), ctx, stream, q, k, v, out, dout, lse, dq, dk, dv,
             softmax_scale, causal);
}

namespace {
void check_block_offsets(const Check& chk, int64_t q_offset, int64_t kv_offset) {
  MESHRT_CHECK(q_offset >= 0 && kv_offset >= 0, "op " << chk.op() << ": q_offset=" << q_offset
                                                      << " and kv_offset=" << kv_offset
                                                      << " must be >= 0 (global token positions)");
}
// The document ids of a doc-masked block (ops.h): both undefined (no mask) or both i32
// [batch, seq] for q's and k's sequences, on the host (the only backend with the mask so far).
// Their order is checked when the work runs (the data may not be written yet).
void check_block_docs(const Check& chk, const Tensor& q, const Tensor& k, const Tensor& q_doc,
                      const Tensor& k_doc) {
  MESHRT_CHECK(q_doc.defined() == k_doc.defined(),
               "op " << chk.op() << ": q_doc and k_doc come together (document masking), got "
                     << (q_doc.defined() ? "q_doc " + q_doc.str() : std::string("no q_doc"))
                     << " and "
                     << (k_doc.defined() ? "k_doc " + k_doc.str() : std::string("no k_doc")));
  if (!q_doc.defined()) return;
  MESHRT_CHECK(chk.device().is_cpu(),
               "op " << chk.op()
                     << ": document masking (q_doc / k_doc) runs on the host backend "
                        "only so far, not on "
                     << chk.device().str() << "; run doc-masked attention on host tensors");
  const std::pair<const Tensor*, const char*> docs[] = {{&q_doc, "q_doc"}, {&k_doc, "k_doc"}};
  for (const auto& [doc, name] : docs) {
    chk.contiguous(*doc, name);
    const Tensor& ref = doc == &q_doc ? q : k;
    MESHRT_CHECK(doc->dtype() == DType::i32 && doc->ndim() == 2 && doc->size(0) == ref.size(0) &&
                     doc->size(1) == ref.size(2),
                 "op " << chk.op() << ": " << name << " " << doc->str() << " must be i32 ["
                       << ref.size(0) << ", " << ref.size(2) << "] (batch, positions of "
                       << (doc == &q_doc ? "q " : "k ") << ref.str() << ")");
  }
}
}  // namespace

void attention_block_fwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& out, const Tensor& lse, float softmax_scale,
                         bool causal, int64_t q_offset, int64_t kv_offset, const Tensor& q_doc,
                         const Tensor& k_doc) {
  Check chk("attention_block_fwd", ctx, stream);
  check_attention(chk, q, k, v, out, lse, softmax_scale, false);
  check_block_offsets(chk, q_offset, kv_offset);
  check_block_docs(chk, q, k, q_doc, k_doc);
  if (q.numel() == 0) return;
  MESHRT_RUN(chk, attention_block_fwd, q.dtype(), ctx, stream, q, k, v, out, lse, softmax_scale,
             causal, q_offset, kv_offset, q_doc, k_doc);
}

void attention_block_bwd(Context& ctx, Stream& stream, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& out, const Tensor& dout, const Tensor& lse,
                         const Tensor& dq, const Tensor& dk, const Tensor& dv, float softmax_scale,
                         bool causal, int64_t q_offset, int64_t kv_offset, const Tensor& q_doc,
                         const Tensor& k_doc) {
  Check chk("attention_block_bwd", ctx, stream);
  check_attention(chk, q, k, v, out, lse, softmax_scale, false);
  check_block_offsets(chk, q_offset, kv_offset);
  check_block_docs(chk, q, k, q_doc, k_doc);
  chk.like(q, "q", dout, "dout");
  chk.like(q, "q", dq, "dq");
  chk.like(k, "k", dk, "dk");
  chk.like(k, "k", dv, "dv");
  if (q.numel() == 0 && k.numel() == 0) return;
  MESHRT_RUN(chk, attention_block_bwd, q.dtype(), ctx, stream, q, k, v, out, dout, lse, dq, dk, dv,
             softmax_scale, causal, q_offset, kv_offset, q_doc, k_doc);
}

void attention_merge(Context& ctx, Stream& stream, const Tensor& out, const Tensor& lse,
                     const Tensor& part_out, const Tensor& part_lse) {
  Check chk("attention_merge", ctx, stream);
  chk.floating(out, "out");
  chk.like(out, "out", part_out, "part_out");
  chk.f32(lse, "lse");
  chk.like(lse, "lse", part_lse, "part_lse");
  MESHRT_CHECK(out.ndim() >= 1 && lse.numel() == row_count(out),
               "op " << chk.op() << ": lse " << lse.str()
                     << " must have one element per row of out " << out.str());
  if (out.numel() == 0) return;
  MESHRT_RUN(chk, attention_merge, out.dtype(), ctx, stream, out, lse, part_out, part_lse);
}

const char* attention_kernel_name(AttentionKernel k) {
  return k == AttentionKernel::Flash ? "flash" : "reference";
}

AttentionKernel parse_attention_kernel(const std::string& name) {
  if (name == "flash") return AttentionKernel::Flash;
  if (name == "reference") return AttentionKernel::Reference;
  MESHRT_FAIL("attention kernel '" << name << "' must be flash or reference");
}

namespace {
// -1 until the first attention_kernel() reads MESHRT_ATTENTION or a set_attention_kernel().
std::atomic<int> g_attention_kernel{-1};
}  // namespace

AttentionKernel attention_kernel() {
  int v = g_attention_kernel.load(std::memory_order_relaxed);
  if (v < 0) {
    AttentionKernel k = AttentionKernel::Flash;
    if (!env_or("MESHRT_ATTENTION").empty())
      k = parse_attention_kernel(env_choice("MESHRT_ATTENTION"));
    int expected = -1;  // a concurrent first use or set_attention_kernel may have won
    g_attention_kernel.compare_exchange_strong(expected, static_cast<int>(k));
    v = g_attention_kernel.load(std::memory_order_relaxed);
  }
  return static_cast<AttentionKernel>(v);
}

void set_attention_kernel(AttentionKernel k) {
  g_attention_kernel.store(static_cast<int>(k), std::memory_order_relaxed);
}

AttentionKernel cuda_attention_kernel(DType dtype, int64_t head_dim, AttentionKernel setting) {
  const bool flash_ok =
      (dtype == DType::bf16 || dtype == DType::f16) && (head_dim == 64 || head_dim == 128);
  return setting == AttentionKernel::Flash && flash_ok ? AttentionKernel::Flash
                                                       : AttentionKernel::Reference;
}

// ---- embedding ----------------------------------------------------------------------------------

namespace {
void check_embedding(const Check& chk, const Tensor& ids, const Tensor& w, const char* wn,
                     const Tensor& out, const char* on, int64_t vocab_offset) {
  chk.index(ids, "ids");
  chk.floating(w, wn);
  MESHRT_CHECK(w.ndim() == 2,
               "op " << chk.op() << ": " << wn << " " << w.str() << " must be [vocab_local, dim]");
  chk.floating(out, on);
  chk.same_dtype(w, wn, out, on);
  Shape want = ids.shape();
  want.push_back(w.size(1));
  MESHRT_CHECK(out.shape() == want, "op " << chk.op() << ": " << on << " " << out.str()
                                          << " must be " << want.str() << " for ids " << ids.str()
                                          << " and " << wn << " " << w.str());
  MESHRT_CHECK(vocab_offset >= 0,
               "op " << chk.op() << ": vocab_offset=" << vocab_offset << " must be >= 0");
}
}  // namespace

void embedding_fwd(Context& ctx, Stream& stream, const Tensor& ids, const Tensor& weight,
                   const Tensor& out, int64_t vocab_offset) {
  Check chk("embedding_fwd", ctx, stream);
  check_embedding(chk, ids, weight, "weight", out, "out", vocab_offset);
  if (out.numel() == 0) return;
  MESHRT_RUN(chk, embedding_fwd, weight.dtype(), ctx, stream, ids, weight, out, vocab_offset);
}

void embedding_bwd(Context& ctx, Stream& stream, const Tensor& ids, const Tensor& dout,
                   const Tensor& dweight, int64_t vocab_offset, bool accumulate) {
  Check chk("embedding_bwd", ctx, stream);
  check_embedding(chk, ids, dweight, "dweight", dout, "dout", vocab_offset);
  if (dweight.numel() == 0) return;
  MESHRT_RUN(chk, embedding_bwd, dweight.dtype(), ctx, stream, ids, dout, dweight, vocab_offset,
             accumulate);
}

// ---- cross-entropy ------------------------------------------------------------------------------

namespace {
void check_logits(const Check& chk, const Tensor& logits, const char* name) {
  chk.floating(logits, name);
  MESHRT_CHECK(logits.ndim() == 2 && logits.size(1) > 0,
               "op " << chk.op() << ": " << name << " " << logits.str()
                     << " must be [rows, vocab_local] with vocab_local > 0");
}
void check_targets(const Check& chk, const Tensor& targets, int64_t rows) {
  chk.index(targets, "targets");
  chk.numel(targets, "targets", rows, "one per row of logits");
}
}  // namespace

void xent_row_max(Context& ctx, Stream& stream, const Tensor& logits, const Tensor& row_max) {
  Check chk("xent_row_max", ctx, stream);
  check_logits(chk, logits, "logits");
  chk.rows_stat(row_max, "row_max", logits);
  if (logits.numel() == 0) return;
  MESHRT_RUN(chk, xent_row_max, logits.dtype(), ctx, stream, logits, row_max);
}

void xent_row_sumexp(Context& ctx, Stream& stream, const Tensor& logits, const Tensor& row_max,
                     const Tensor& sumexp) {
  Check chk("xent_row_sumexp", ctx, stream);
  check_logits(chk, logits, "logits");
  chk.rows_stat(row_max, "row_max", logits);
  chk.rows_stat(sumexp, "sumexp", logits);
  if (logits.numel() == 0) return;
  MESHRT_RUN(chk, xent_row_sumexp, logits.dtype(), ctx, stream, logits, row_max, sumexp);
}

void xent_target_logit(Context& ctx, Stream& stream, const Tensor& logits, const Tensor& targets,
                       const Tensor& target_logit, int64_t vocab_offset, int64_t ignore_index) {
  Check chk("xent_target_logit", ctx, stream);
  check_logits(chk, logits, "logits");
  check_targets(chk, targets, logits.size(0));
  chk.rows_stat(target_logit, "target_logit", logits);
  MESHRT_CHECK(vocab_offset >= 0,
               "op xent_target_logit: vocab_offset=" << vocab_offset << " must be >= 0");
  if (logits.numel() == 0) return;
  MESHRT_RUN(chk, xent_target_logit, logits.dtype(), ctx, stream, logits, targets, target_logit,
             vocab_offset, ignore_index);
}

void xent_loss(Context& ctx, Stream& stream, const Tensor& row_max, const Tensor& sumexp,
               const Tensor& target_logit, const Tensor& targets, const Tensor& loss,
               int64_t ignore_index) {
  Check chk("xent_loss", ctx, stream);
  chk.f32(row_max, "row_max");
  int64_t rows = row_max.numel();
  chk.f32(sumexp, "sumexp");
  chk.numel(sumexp, "sumexp", rows, "one per row, like row_max");
  chk.f32(target_logit, "target_logit");
  chk.numel(target_logit, "target_logit", rows, "one per row, like row_max");
  check_targets(chk, targets, rows);
  chk.f32(loss, "loss");
  chk.numel(loss, "loss", rows, "one per row, like row_max");
  if (rows == 0) return;
  MESHRT_RUN(chk, xent_loss, row_max.dtype(), ctx, stream, row_max, sumexp, target_logit, targets,
             loss, ignore_index);
}

void xent_grad(Context& ctx, Stream& stream, const Tensor& logits, const Tensor& row_max,
               const Tensor& sumexp, const Tensor& targets, const Tensor& dlogits,
               int64_t vocab_offset, float grad_scale, int64_t ignore_index) {
  Check chk("xent_grad", ctx, stream);
  check_logits(chk, logits, "logits");
  chk.rows_stat(row_max, "row_max", logits);
  chk.rows_stat(sumexp, "sumexp", logits);
  check_targets(chk, targets, logits.size(0));
  chk.like(logits, "logits", dlogits, "dlogits");
  MESHRT_CHECK(vocab_offset >= 0, "op xent_grad: vocab_offset=" << vocab_offset << " must be >= 0");
  if (logits.numel() == 0) return;
  MESHRT_RUN(chk, xent_grad, logits.dtype(), ctx, stream, logits, row_max, sumexp, targets, dlogits,
             vocab_offset, grad_scale, ignore_index);
}

// ---- optimizers ---------------------------------------------------------------------------------

namespace {
void check_param_lists(const Check& chk, std::span<const Tensor> params,
                       std::span<const Tensor> grads, std::span<const Tensor> s1, const char* s1n,
                       const std::span<const Tensor>* s2, const char* s2n) {
  MESHRT_CHECK(grads.size() == params.size() && s1.size() == params.size() &&
                   (!s2 || s2->size() == params.size()),
               "op " << chk.op() << ": list lengths differ: " << params.size() << " params, "
                     << grads.size() << " grads, " << s1.size() << " " << s1n
                     << (s2 ? ", " + std::to_string(s2->size()) + " " + s2n : std::string()));
  for (size_t i = 0; i < params.size(); ++i) {
    std::string pi = "params[" + std::to_string(i) + "]";
    std::string gi = "grads[" + std::to_string(i) + "]";
    std::string si = std::string(s1n) + "[" + std::to_string(i) + "]";
    chk.floating(params[i], pi.c_str());
    chk.floating(grads[i], gi.c_str());
    chk.same_shape(params[i], pi.c_str(), grads[i], gi.c_str());
    MESHRT_CHECK(grads[i].dtype() == params[i].dtype() || grads[i].dtype() == DType::f32,
                 "op " << chk.op() << ": " << gi << " " << grads[i].str() << " must have " << pi
                       << "'s dtype (" << params[i].str() << ") or f32");
    chk.f32(s1[i], si.c_str());
    chk.same_shape(params[i], pi.c_str(), s1[i], si.c_str());
    if (s2) {
      std::string s2i = std::string(s2n) + "[" + std::to_string(i) + "]";
      chk.f32((*s2)[i], s2i.c_str());
      chk.same_shape(params[i], pi.c_str(), (*s2)[i], s2i.c_str());
    }
  }
}
}  // namespace

void adamw_update(Context& ctx, Stream& stream, std::span<const Tensor> params,
                  std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
                  std::span<const Tensor> exp_avg_sq, const AdamWConfig& cfg) {
  Check chk("adamw_update", ctx, stream);
  check_param_lists(chk, params, grads, exp_avg, "exp_avg", &exp_avg_sq, "exp_avg_sq");
  MESHRT_CHECK(cfg.step >= 1, "op adamw_update: step=" << cfg.step << " must be >= 1");
  MESHRT_CHECK(
      cfg.beta1 >= 0.f && cfg.beta1 < 1.f && cfg.beta2 >= 0.f && cfg.beta2 < 1.f,
      "op adamw_update: betas (" << cfg.beta1 << ", " << cfg.beta2 << ") must be in [0, 1)");
  if (params.empty()) return;
  for (const Tensor& p : params.subspan(1))
    kernels::require_support(backend_of(chk), kernels::Op::adamw_update, p.dtype());
  MESHRT_RUN(chk, adamw_update, params[0].dtype(), ctx, stream, params, grads, exp_avg, exp_avg_sq,
             cfg);
}

void sgd_momentum_update(Context& ctx, Stream& stream, std::span<const Tensor> params,
                         std::span<const Tensor> grads, std::span<const Tensor> momentum_bufs,
                         const SgdConfig& cfg) {
  Check chk("sgd_momentum_update", ctx, stream);
  check_param_lists(chk, params, grads, momentum_bufs, "momentum_bufs", nullptr, "");
  MESHRT_CHECK(!cfg.nesterov || (cfg.momentum > 0.f && cfg.dampening == 0.f),
               "op sgd_momentum_update: nesterov needs momentum > 0 and dampening 0 (got "
                   << cfg.momentum << ", " << cfg.dampening << ")");
  if (params.empty()) return;
  for (const Tensor& p : params.subspan(1))
    kernels::require_support(backend_of(chk), kernels::Op::sgd_momentum_update, p.dtype());
  MESHRT_RUN(chk, sgd_momentum_update, params[0].dtype(), ctx, stream, params, grads, momentum_bufs,
             cfg);
}

std::string gemm_library_version() {
  const detail::CudaPlugin* cuda = detail::cuda_plugin();
  return cuda ? cuda->gemm_library_version() : "";
}

}  // namespace meshrt::ops
