// Both CUDA attention kernels (flash on tensor cores, and the reference) against the host twin,
// plus the host-side choice of kernel. The CUDA cases skip with the reason when no GPU is usable
// (see main.cpp).
#include <cmath>
#include <cstdint>

#include "helpers.h"
#include "runtime/error.h"

using namespace kt;
using Catch::Matchers::Contains;
namespace ops = meshrt::ops;
using ops::AttentionKernel;

namespace {

// Restores the process-wide attention kernel setting when a test ends.
struct KernelSetting {
  AttentionKernel saved = ops::attention_kernel();
  ~KernelSetting() { ops::set_attention_kernel(saved); }
};

}  // namespace

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

namespace {

bool gpu_ready() {
  std::string why;
  if (meshrt::cuda_available(&why)) return true;
  WARN("SKIPPED: CUDA unavailable: " << why);
  return false;
}

struct Gpu {
  Host host;
  Context ctx{Device::cuda(0)};
  Stream& s() { return ctx.compute_stream(); }
  Tensor up(const Tensor& t) {
    host.sync();
    return t.to(ctx.allocator_ptr(), s());
  }
  Vec down(const Tensor& d) {
    Tensor h = d.to(host.ctx.allocator_ptr(), s());
    ctx.synchronize();
    return h.to_vector();
  }
};

// Tolerances, in units of the dtype's unit roundoff u (bf16 2^-8, f16 2^-11), checked as
// |gpu - host| <= tol * (|host| + rms(host)). Both sides start from the same 16-bit inputs and
// round their result once (up to 2u of the element apart). Flash also rounds P and dS to 16
// bits before the second product of each pair (relative u per term); those errors average over
// the summed terms, so they scale with the tensor's rms, not with the element: hence the rms
// floor. 8u covers both with margin, while an indexing or masking error moves elements by
// O(rms) and fails by a factor of ~30 (bf16) or ~250 (f16).
double tol16(DType dt) { return 8.0 * (dt == DType::bf16 ? 0x1p-8 : 0x1p-11); }

void check_vs_host(Gpu& g, const Tensor& dev, const Tensor& host, double tol,
                   const std::string& what) {
  check_close(g.down(dev), read(g.host, host), tol, what, 1.0);
}

}  // namespace

TEST_CASE("cuda attention kernels match the host (flash and reference)", "[cuda]") {
  if (!gpu_ready()) return;
  KernelSetting keep;
  Gpu g;
  auto kernel = GENERATE(AttentionKernel::Flash, AttentionKernel::Reference);
  auto dt = GENERATE(DType::bf16, DType::f16);
  ops::set_attention_kernel(kernel);
  struct S {
    int64_t b, h, sq, sk;
  };
  // Sequence lengths around the tiles (64 query rows / keys, 32-row backward query tiles),
  // several heads, and seq_q != seq_k without the causal mask.
  std::vector<S> shapes;
  for (int64_t n : {1, 17, 64, 100, 257}) shapes.push_back({1, 2, n, n});
  shapes.push_back({2, 3, 70, 70});
  shapes.push_back({1, 2, 17, 100});
  shapes.push_back({1, 1, 257, 33});
  for (int64_t d : {64, 128}) {
    REQUIRE(ops::cuda_attention_kernel(dt, d) == kernel);
    for (bool causal : {true, false}) {
      for (S s : shapes) {
        if (causal && s.sq != s.sk) continue;
        const Shape qs{s.b, s.h, s.sq, d}, ks{s.b, s.h, s.sk, d};
        std::ostringstream w;
        w << ops::attention_kernel_name(kernel) << " " << dt_name(dt)
          << (causal ? " causal " : " full ") << qs.str() << " sk=" << s.sk;
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        Host& h = g.host;
        Tensor q = rand_tensor(h, qs, dt, 1, -2, 2), k = rand_tensor(h, ks, dt, 2, -2, 2);
        Tensor v = rand_tensor(h, ks, dt, 3), dout = rand_tensor(h, qs, dt, 4);
        Tensor out = h.ctx.empty(qs, dt), lse = h.ctx.empty({s.b, s.h, s.sq}, DType::f32);
        Tensor dq = h.ctx.empty(qs, dt), dk = h.ctx.empty(ks, dt), dv = h.ctx.empty(ks, dt);
        ops::attention_fwd(h.ctx, h.s(), q, k, v, out, lse, scale, causal);
        ops::attention_bwd(h.ctx, h.s(), q, k, v, out, dout, lse, dq, dk, dv, scale, causal);

        Tensor Q = g.up(q), K = g.up(k), V = g.up(v), dO = g.up(dout);
        Tensor O = g.ctx.empty(qs, dt), L = g.ctx.empty({s.b, s.h, s.sq}, DType::f32);
        if (kernel == AttentionKernel::Flash) {
          // Flash needs 16-byte aligned tensors; otherwise this would test the reference.
          for (const Tensor* t : {&Q, &K, &V, &dO, &O}) {
            REQUIRE(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
          }
        }
        ops::attention_fwd(g.ctx, g.s(), Q, K, V, O, L, scale, causal);
        check_vs_host(g, O, out, tol16(dt), "attention out " + w.str());
        // lse is f32 math on both sides from the same inputs: only accumulation order, exp2 /
        // log2-domain rescaling and library exp / log differ (~1e-6 absolute); dropping or
        // adding one key of 257 moves it by ~1e-3.
        check_close(g.down(L), read(h, lse), 5e-5, "attention lse " + w.str());

        // Backward from the host's out and lse, so only the backward kernels differ.
        Tensor Oh = g.up(out), Lh = g.up(lse);
        Tensor dQ = g.ctx.empty(qs, dt), dK = g.ctx.empty(ks, dt), dV = g.ctx.empty(ks, dt);
        ops::attention_bwd(g.ctx, g.s(), Q, K, V, Oh, dO, Lh, dQ, dK, dV, scale, causal);
        check_vs_host(g, dQ, dq, tol16(dt), "attention dq " + w.str());
        check_vs_host(g, dK, dk, tol16(dt), "attention dk " + w.str());
        check_vs_host(g, dV, dv, tol16(dt), "attention dv " + w.str());
      }
    }
  }
}
