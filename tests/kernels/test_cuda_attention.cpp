// Both CUDA attention kernels (flash on tensor cores, and the reference) against the host, plus
// the host-side choice of kernel. The cases, inputs and tolerances are attention_cases.h's, which
// test_attention_twin.cpp proves on the CPU. The CUDA cases skip with the reason when no GPU is
// usable (tests/common/cuda_skip.h).
#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_cases.h"
#include "runtime/error.h"
#include "tests/common/cuda_skip.h"

using namespace kt;
using namespace kt::attn;
using Catch::Matchers::Contains;
namespace ops = meshrt::ops;

TEST_CASE("attention kernel choice: names, setting and CUDA support", "[attention]") {
  KernelSetting keep;
  CHECK(ops::parse_attention_kernel("flash") == AttentionKernel::Flash);
  CHECK(ops::parse_attention_kernel("reference") == AttentionKernel::Reference);
  CHECK(std::string(ops::attention_kernel_name(AttentionKernel::Flash)) == "flash");
  CHECK(std::string(ops::attention_kernel_name(AttentionKernel::Reference)) == "reference");
  REQUIRE_THROWS_WITH(ops::parse_attention_kernel("fast"),
                      Contains("'fast'") && Contains("flash or reference"));
  REQUIRE_THROWS_WITH(ops::parse_attention_kernel(""), Contains("flash or reference"));

  ops::set_attention_kernel(AttentionKernel::Reference);
  CHECK(ops::attention_kernel() == AttentionKernel::Reference);
  ops::set_attention_kernel(AttentionKernel::Flash);
  CHECK(ops::attention_kernel() == AttentionKernel::Flash);

  // Flash runs exactly for bf16 / f16 with head_dim 64 or 128; everything else, and every shape
  // under the reference setting, runs the reference kernel.
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t d : {1, 8, 32, 63, 64, 65, 96, 127, 128, 129, 256}) {
      const bool flash_ok = dt != DType::f32 && (d == 64 || d == 128);
      INFO(dt_name(dt) << " head_dim " << d);
      CHECK(ops::cuda_attention_kernel(dt, d, AttentionKernel::Flash) ==
            (flash_ok ? AttentionKernel::Flash : AttentionKernel::Reference));
      CHECK(ops::cuda_attention_kernel(dt, d, AttentionKernel::Reference) ==
            AttentionKernel::Reference);
    }
  }
  // The default argument is the current setting.
  ops::set_attention_kernel(AttentionKernel::Reference);
  CHECK(ops::cuda_attention_kernel(DType::bf16, 64) == AttentionKernel::Reference);
  ops::set_attention_kernel(AttentionKernel::Flash);
  CHECK(ops::cuda_attention_kernel(DType::bf16, 64) == AttentionKernel::Flash);
}

TEST_CASE("attention kernel setting does not change the host backend", "[attention]") {
  // The host has one kernel: both settings give bit-identical results.
  KernelSetting keep;
  Host h;
  const Shape qs{1, 2, 17, 64};
  Tensor q = rand_tensor(h, qs, DType::bf16, 1), k = rand_tensor(h, qs, DType::bf16, 2),
         v = rand_tensor(h, qs, DType::bf16, 3);
  Vec outs[2];
  for (int i = 0; i < 2; ++i) {
    ops::set_attention_kernel(i == 0 ? AttentionKernel::Flash : AttentionKernel::Reference);
    Tensor out = h.ctx.empty(qs, DType::bf16), lse = h.ctx.empty({1, 2, 17}, DType::f32);
    ops::attention_fwd(h.ctx, h.s(), q, k, v, out, lse, 0.125f, true);
    outs[i] = read(h, out);
  }
  CHECK(outs[0] == outs[1]);
}

TEST_CASE("cuda attention kernels match the host (flash and reference)", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  for (const Case& c : kernel_cases()) check_on_gpu(g, c);
}

// tools/gpu-check.sh runs this tag under compute-sanitizer (memcheck, racecheck).
TEST_CASE("cuda attention kernels under compute-sanitizer (small shapes)", "[cuda][sanitize]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  const std::vector<Case> cases = sanitize_cases();
  REQUIRE(cases.size() == 16);
  for (const Case& c : cases) check_on_gpu(g, c);
}

TEST_CASE("cuda attention with a non-default softmax scale matches the host", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  for (const Case& c : scale_cases()) check_on_gpu(g, c);
}

TEST_CASE("cuda attention: the GPU forward feeds the GPU backward", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  for (const Case& c : chain_cases()) check_on_gpu(g, c);
}

TEST_CASE("cuda flash attention at a 4k sequence matches the host", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  check_on_gpu(g, long_case());
}

namespace {

// Forward and backward with seq_q = 0 or seq_k = 0 on ctx (inputs moved there by up, results
// read back by down): no keys give out 0, lse -inf and no gradient for q; no queries give no
// gradient for k and v. Outputs start at 7, so an element left unwritten shows.
template <class Up, class Down>
void check_empty_seqs(Context& ctx, Host& h, DType dt, Up up, Down down) {
  const double inf = std::numeric_limits<double>::infinity();
  struct Z {
    int64_t sq, sk;
    bool causal;
  };
  for (Z z : {Z{0, 5, false}, Z{5, 0, false}, Z{0, 0, true}, Z{0, 0, false}}) {
    INFO(dt_name(dt) << " seq_q=" << z.sq << " seq_k=" << z.sk << " causal=" << z.causal);
    const Shape qs{2, 3, z.sq, 64}, ks{2, 3, z.sk, 64};
    Tensor Q = up(rand_tensor(h, qs, dt, 1)), K = up(rand_tensor(h, ks, dt, 2));
    Tensor V = up(rand_tensor(h, ks, dt, 3)), dO = up(rand_tensor(h, qs, dt, 4));
    Tensor O = ctx.empty(qs, dt), L = ctx.empty({2, 3, z.sq}, DType::f32);
    Tensor dQ = ctx.empty(qs, dt), dK = ctx.empty(ks, dt), dV = ctx.empty(ks, dt);
    Stream& s = ctx.compute_stream();
    for (Tensor* t : {&O, &L, &dQ, &dK, &dV}) t->fill_(7, s);
    ops::attention_fwd(ctx, s, Q, K, V, O, L, 0.125f, z.causal);
    ops::attention_bwd(ctx, s, Q, K, V, O, dO, L, dQ, dK, dV, 0.125f, z.causal);
    CHECK(down(O) == Vec(static_cast<size_t>(qs.numel()), 0.0));
    CHECK(down(L) == Vec(static_cast<size_t>(2 * 3 * z.sq), -inf));
    CHECK(down(dQ) == Vec(static_cast<size_t>(qs.numel()), 0.0));
    CHECK(down(dK) == Vec(static_cast<size_t>(ks.numel()), 0.0));
    CHECK(down(dV) == Vec(static_cast<size_t>(ks.numel()), 0.0));
  }
}

}  // namespace

TEST_CASE("attention with seq_q = 0 or seq_k = 0 on the host", "[attention]") {
  Host h;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    check_empty_seqs(
        h.ctx, h, dt, [](const Tensor& t) { return t; },
        [&](const Tensor& t) { return read(h, t); });
  }
}

TEST_CASE("cuda attention with seq_q = 0 or seq_k = 0", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  for (AttentionKernel kernel : {AttentionKernel::Flash, AttentionKernel::Reference}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      ops::set_attention_kernel(kernel);
      REQUIRE(ops::cuda_attention_kernel(dt, 64) == kernel);
      INFO(ops::attention_kernel_name(kernel));
      check_empty_seqs(
          g.ctx, g.host, dt, [&](const Tensor& t) { return g.up(t); },
          [&](const Tensor& t) { return g.down(t); });
    }
  }
}

namespace {

// A contiguous [shape] view starting one element into a fresh GPU buffer (2 bytes past 16-byte
// alignment for 16-bit dtypes), holding t's values.
Tensor unaligned_copy(Gpu& g, const Tensor& t) {
  Tensor buf = g.ctx.empty({t.numel() + 8}, t.dtype());
  Tensor view = buf.narrow(0, 1, t.numel()).view(t.shape());
  REQUIRE(reinterpret_cast<uintptr_t>(view.data_ptr()) % 16 != 0);
  view.copy_(t, g.s());
  return view;
}

}  // namespace

TEST_CASE("cuda attention on unaligned views falls back to the reference, same results", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  // Flash cases: bf16 causal 257 x 257 at head_dim 64, f16 17 x 100 at head_dim 128.
  std::vector<Case> cases;
  for (const Case& c : chain_cases()) {
    if (c.kernel != AttentionKernel::Flash) continue;
    if ((c.dt == DType::bf16 && c.causal && c.sq == 257 && c.d == 64) ||
        (c.dt == DType::f16 && c.sk == 100 && c.d == 128))
      cases.push_back(c);
  }
  REQUIRE(cases.size() == 2);
  for (const Case& c : cases) {
    INFO(c.name());
    const Inputs in = make_inputs(g.host, c);
    Tensor Q = g.up(in.q), K = g.up(in.k), V = g.up(in.v), dO = g.up(in.dout);
    // [aligned reference kernel, unaligned views under the flash setting]
    std::string got[2][5];
    for (int run = 0; run < 2; ++run) {
      const bool views = run == 1;
      ops::set_attention_kernel(views ? AttentionKernel::Flash : AttentionKernel::Reference);
      auto place = [&](const Tensor& t) { return views ? unaligned_copy(g, t) : t; };
      Tensor q = place(Q), k = place(K), v = place(V), dout = place(dO);
      Tensor o = place(g.ctx.zeros(c.q_shape(), c.dt)), dq = place(g.ctx.zeros(c.q_shape(), c.dt));
      Tensor dk = place(g.ctx.zeros(c.k_shape(), c.dt)), dv = place(g.ctx.zeros(c.k_shape(), c.dt));
      Tensor lse = g.ctx.empty(c.lse_shape(), DType::f32);
      ops::attention_fwd(g.ctx, g.s(), q, k, v, o, lse, c.scale, c.causal);
      ops::attention_bwd(g.ctx, g.s(), q, k, v, o, dout, lse, dq, dk, dv, c.scale, c.causal);
      const Tensor* outs[5] = {&o, &lse, &dq, &dk, &dv};
      for (int i = 0; i < 5; ++i) got[run][i] = g.bytes(outs[i]->contiguous(g.s()));
    }
    const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) {
      INFO(names[i] << ": bit-identical to the reference kernel on aligned tensors");
      const bool same = got[0][i] == got[1][i];  // (not printing the bytes)
      CHECK(same);
    }
  }
}

TEST_CASE("cuda attention gives identical bits on two runs (flash and reference)", "[cuda]") {
  if (!meshrt::test::gpu_or_warn()) return;
  KernelSetting keep;
  Gpu g;
  for (const Case& c : chain_cases()) {
    if (c.sk == 100) continue;  // the two larger shapes, causal and not
    INFO(c.name());
    ops::set_attention_kernel(c.kernel);
    const Inputs in = make_inputs(g.host, c);
    Tensor Q = g.up(in.q), K = g.up(in.k), V = g.up(in.v), dO = g.up(in.dout);
    std::string got[2][5];
    for (int run = 0; run < 2; ++run) {
      Tensor o = g.ctx.empty(c.q_shape(), c.dt), lse = g.ctx.empty(c.lse_shape(), DType::f32);
      Tensor dq = g.ctx.empty(c.q_shape(), c.dt), dk = g.ctx.empty(c.k_shape(), c.dt),
             dv = g.ctx.empty(c.k_shape(), c.dt);
      ops::attention_fwd(g.ctx, g.s(), Q, K, V, o, lse, c.scale, c.causal);
      ops::attention_bwd(g.ctx, g.s(), Q, K, V, o, dO, lse, dq, dk, dv, c.scale, c.causal);
      const Tensor* outs[5] = {&o, &lse, &dq, &dk, &dv};
      for (int i = 0; i < 5; ++i) got[run][i] = g.bytes(*outs[i]);
    }
    for (int i = 0; i < 5; ++i) {
      INFO("output " << i << " (out, lse, dq, dk, dv): identical bytes in both runs");
      const bool same = got[0][i] == got[1][i];
      CHECK(same);
    }
  }
}
