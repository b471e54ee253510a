// Row softmax and fused causal attention: double references and finite differences.
#include <cmath>

#include "attention_twin.h"
#include "helpers.h"
#include "kernels/host/gemm_dnnl.h"
#include "tests/common/env.h"

using namespace kt;
namespace ops = meshrt::ops;

TEST_CASE("softmax_rows forward and backward match references", "[softmax]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto shape = GENERATE(Shape{1, 1}, Shape{5, 7}, Shape{2, 3, 33}, Shape{17, 1000});
  const float scale = 0.7f;
  const int64_t n = shape[shape.ndim() - 1], rows = shape.numel() / n;
  Tensor x = rand_tensor(h, shape, dt, 1, -5, 5), dy = rand_tensor(h, shape, dt, 2);
  Vec xv = read(h, x), dyv = read(h, dy);
  Tensor y = h.ctx.empty(shape, dt), dx = h.ctx.empty(shape, dt);
  ops::softmax_rows_fwd(h.ctx, h.s(), x, y, scale);
  Vec yv = read(h, y);
  ops::softmax_rows_bwd(h.ctx, h.s(), y, dy, dx, scale);
  Vec yref(xv.size()), dxref(xv.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * xv[r * n + j]);
    for (int64_t j = 0; j < n; ++j) s += std::exp(scale * xv[r * n + j] - m);
    for (int64_t j = 0; j < n; ++j) yref[r * n + j] = std::exp(scale * xv[r * n + j] - m) / s;
    // Backward from the kernel's own y (as training does).
    double d = 0;
    for (int64_t j = 0; j < n; ++j) d += yv[r * n + j] * dyv[r * n + j];
    for (int64_t j = 0; j < n; ++j) dxref[r * n + j] = scale * yv[r * n + j] * (dyv[r * n + j] - d);
  }
  std::string tag = dt_name(dt) + " " + shape.str();
  check_close(yv, yref, tol_for(dt, 1e-5), "softmax fwd " + tag, 0.01);
  check_close(read(h, dx), dxref, tol_for(dt, 1e-5), "softmax bwd " + tag, 0.05);
}

TEST_CASE("softmax_rows backward matches finite differences", "[softmax][fd]") {
  Host h;
  const Shape shape{3, 9};
  Vec xv = uniform(27, 5, -2, 2), w = uniform(27, 6);
  Tensor x = make(h, shape, DType::f32, xv), dy = make(h, shape, DType::f32, w);
  Tensor y = h.ctx.empty(shape, DType::f32), dx = h.ctx.empty(shape, DType::f32);
  auto fwd = [&] {
    ops::softmax_rows_fwd(h.ctx, h.s(), x, y, 1.3f);
    return dot(read(h, y), w);
  };
  fwd();
  ops::softmax_rows_bwd(h.ctx, h.s(), y, dy, dx, 1.3f);
  check_grad_fd(
      [&](const Vec& v) {
        write(h, x, v);
        return fwd();
      },
      xv, read(h, dx), "softmax dx");
}

namespace {

struct AttnShape {
  int64_t b, h, sq, sk, d;
};

}  // namespace

TEST_CASE("attention forward and backward match a naive double reference", "[attention]") {
  // f16 too: its rows convert with F16C in the avx2 / avx512 loop variants (reduce.h).
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto causal = GENERATE(true, false);
  auto sh =
      GENERATE(AttnShape{1, 1, 1, 1, 1}, AttnShape{1, 2, 17, 17, 8}, AttnShape{2, 3, 70, 70, 13},
               AttnShape{1, 2, 130, 130, 64}, AttnShape{1, 1, 9, 23, 16},
               // Several of the forward's 256-key blocks, the last one partial; and keys
               // longer than queries (non-causal).
               AttnShape{1, 2, 531, 531, 16}, AttnShape{1, 1, 70, 600, 8});
  if (causal && sh.sq != sh.sk) return;
  const int64_t bh = sh.b * sh.h;
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.d));
  Shape qs{sh.b, sh.h, sh.sq, sh.d}, ks{sh.b, sh.h, sh.sk, sh.d};
  Tensor q = rand_tensor(h, qs, dt, 1, -2, 2), k = rand_tensor(h, ks, dt, 2, -2, 2);
  Tensor v = rand_tensor(h, ks, dt, 3), dout = rand_tensor(h, qs, dt, 4);
  Tensor out = h.ctx.empty(qs, dt), lse = h.ctx.empty({sh.b, sh.h, sh.sq}, DType::f32);
  Tensor dq = h.ctx.empty(qs, dt), dk = h.ctx.empty(ks, dt), dv = h.ctx.empty(ks, dt);
  ops::attention_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, causal);
  ops::attention_bwd(h.ctx, h.s(), q, k, v, out, dout, lse, dq, dk, dv, scale, causal);
  // Float64 throughout; D = dO . O from the kernel's (rounded) output, as training does.
  const AttnProblem p{bh, sh.sq, sh.sk, sh.d, scale, causal};
  const Vec qv = read(h, q), kv = read(h, k), vv = read(h, v), gv = read(h, dout);
  const AttnFwd rf = attn_model_fwd(p, AttnNumerics::Float64, dt, qv, kv, vv);
  const AttnGrads rb =
      attn_model_bwd(p, AttnNumerics::Float64, dt, qv, kv, vv, read(h, out), gv, rf.lse);
  std::ostringstream tag;
  tag << dt_name(dt) << (causal ? " causal" : " full") << " b=" << sh.b << " h=" << sh.h
      << " sq=" << sh.sq << " sk=" << sh.sk << " d=" << sh.d;
  const double tol = dt == DType::f32 ? 1e-4 : 3e-2;
  check_close(read(h, out), rf.out, tol, "attention out " + tag.str());
  check_close(read(h, lse), rf.lse, 1e-5, "attention lse " + tag.str());
  check_close(read(h, dq), rb.dq, tol, "attention dq " + tag.str());
  check_close(read(h, dk), rb.dk, tol, "attention dk " + tag.str());
  check_close(read(h, dv), rb.dv, tol, "attention dv " + tag.str());
}

TEST_CASE("attention backward matches finite differences", "[attention][fd]") {
  Host h;
  auto causal = GENERATE(true, false);
  const Shape s{1, 2, 9, 4};
  const int64_t n = s.numel();
  const float scale = 0.5f;
  Vec qv = uniform(n, 11, -1, 1), kv = uniform(n, 12, -1, 1), vv = uniform(n, 13),
      w = uniform(n, 14);
  Tensor q = make(h, s, DType::f32, qv), k = make(h, s, DType::f32, kv);
  Tensor v = make(h, s, DType::f32, vv), dout = make(h, s, DType::f32, w);
  Tensor out = h.ctx.empty(s, DType::f32), lse = h.ctx.empty({1, 2, 9}, DType::f32);
  Tensor dq = h.ctx.empty(s, DType::f32), dk = h.ctx.empty(s, DType::f32),
         dv = h.ctx.empty(s, DType::f32);
  auto fwd = [&] {
    ops::attention_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, causal);
    return dot(read(h, out), w);
  };
  fwd();
  ops::attention_bwd(h.ctx, h.s(), q, k, v, out, dout, lse, dq, dk, dv, scale, causal);
  Vec dqv = read(h, dq), dkv = read(h, dk), dvv = read(h, dv);
  check_grad_fd(
      [&](const Vec& x) {
        write(h, q, x);
        return fwd();
      },
      qv, dqv, "attention dq");
  write(h, q, qv);
  check_grad_fd(
      [&](const Vec& x) {
        write(h, k, x);
        return fwd();
      },
      kv, dkv, "attention dk");
  write(h, k, kv);
  check_grad_fd(
      [&](const Vec& x) {
        write(h, v, x);
        return fwd();
      },
      vv, dvv, "attention dv");
}

TEST_CASE("attention forward under MESHRT_HOST_F32_GEMM=bf16 takes bf16 products", "[attention]") {
  // f32 attention's forward tiles go to oneDNN with bf16 products in this mode (where oneDNN has
  // them: dnnl_f32_bf16_impl()): within bf16 tolerance of the double reference, and not the
  // strict f32 result. The backward stays on f32 sgemm.
  if (!meshrt::kernels::host::dnnl_built()) return;  // the mode is refused without oneDNN
  Host h;
  auto sh = GENERATE(AttnShape{1, 2, 130, 130, 64}, AttnShape{1, 2, 531, 531, 16});
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.d));
  Shape qs{sh.b, sh.h, sh.sq, sh.d}, ks{sh.b, sh.h, sh.sk, sh.d};
  Tensor q = rand_tensor(h, qs, DType::f32, 11, -2, 2),
         k = rand_tensor(h, ks, DType::f32, 12, -2, 2);
  Tensor v = rand_tensor(h, ks, DType::f32, 13);
  auto forward = [&](const char* mode) {
    meshrt::test::ScopedEnv env("MESHRT_HOST_F32_GEMM", mode);
    Tensor out = h.ctx.empty(qs, DType::f32), lse = h.ctx.empty({sh.b, sh.h, sh.sq}, DType::f32);
    ops::attention_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, true);
    return std::make_pair(read(h, out), read(h, lse));
  };
  const auto strict = forward("openblas");
  const auto bf16 = forward("bf16");
  const AttnProblem p{sh.b * sh.h, sh.sq, sh.sk, sh.d, scale, true};
  const Vec qv = read(h, q), kv = read(h, k), vv = read(h, v);
  const AttnFwd rf = attn_model_fwd(p, AttnNumerics::Float64, DType::f32, qv, kv, vv);
  // The bf16-product references: q, k and v rounded to bf16, the rest in double.
  auto rounded = [](Vec x) {
    for (double& e : x) e = round_to(e, DType::bf16);
    return x;
  };
  const AttnFwd rr =
      attn_model_fwd(p, AttnNumerics::Float64, DType::f32, rounded(qv), rounded(kv), rounded(vv));
  std::ostringstream tag;
  tag << "sq=" << sh.sq << " d=" << sh.d << " bf16-product matmul '"
      << meshrt::kernels::host::dnnl_f32_bf16_impl() << "'";
  check_close(strict.first, rf.out, 1e-4, "strict out " + tag.str());
  // oneDNN takes bf16 products per tile as its kernels allow (with head_dim 16 the Q K^T tiles
  // stay f32 here), so scores are exact products of either the rounded or the given q and k (f32
  // sums): lse matches one of the two references to f32 error. The output's one further
  // rounding is P's (in [0, 1]) to bf16 for P V: off by at most 2^-9 sum_j P_j |v_j| <= 2^-9
  // max |v| from it, and as much again from normalising by the unrounded row sum; |v| <= 1 here.
  double worst_out = 0, worst_lse = 0;
  for (size_t i = 0; i < rr.out.size(); ++i)
    worst_out = std::max(worst_out, std::min(std::abs(bf16.first[i] - rr.out[i]),
                                             std::abs(bf16.first[i] - rf.out[i])));
  for (size_t i = 0; i < rr.lse.size(); ++i)
    worst_lse = std::max(worst_lse, std::min(std::abs(bf16.second[i] - rr.lse[i]),
                                             std::abs(bf16.second[i] - rf.lse[i])) /
                                        (1 + std::abs(rr.lse[i])));
  INFO(tag.str() << ": worst |out - nearer reference| " << worst_out << ", lse relative "
                 << worst_lse);
  CHECK(worst_out <= 2.0 / 512 + 1e-5);
  CHECK(worst_lse < 1e-5);
  if (!meshrt::kernels::host::dnnl_f32_bf16_impl().empty()) {
    CHECK(bf16.first != strict.first);
  }
}
