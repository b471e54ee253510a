// The CUDA attention tests' cases, inputs and tolerances (see attention_cases.h).
#include "attention_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <sstream>

namespace kt::attn {

namespace ops = meshrt::ops;

double unit_roundoff(DType dt) { return dt == DType::bf16 ? 0x1p-8 : 0x1p-11; }

Tol tol16(DType dt) { return {8.0 * unit_roundoff(dt), 0.1, 1.0}; }
Tol chain_tol16(DType dt) { return {8.0 * unit_roundoff(dt), 1.0, 1.0}; }
Tol lse_tol16() { return {5e-5, 0.1}; }
Tol reference_tol(DType dt) { return {dt == DType::f32 ? 2e-4 : 3e-2, 0.1}; }
Tol reference_lse_tol() { return {1e-5, 0.1}; }

std::string Case::name() const {
  std::ostringstream w;
  w << ops::attention_kernel_name(kernel) << " " << dt_name(dt) << (causal ? " causal " : " full ")
    << q_shape().str() << " sk=" << sk << " scale=" << scale << (chain ? " (gpu fwd->bwd)" : "");
  return w.str();
}

namespace {

struct Dims {
  int64_t b, h, sq, sk;
};

float default_scale(int64_t d) { return 1.0f / std::sqrt(static_cast<float>(d)); }

// Every kernel x 16-bit dtype x head_dim 64 / 128 x mask of `shapes` (causal only where
// sq == sk), at the scales `scale_of` gives.
template <class ScaleOf>
std::vector<Case> flash_grid(const std::string& test, const std::vector<Dims>& shapes, bool chain,
                             ScaleOf scale_of) {
  std::vector<Case> out;
  for (AttentionKernel kernel : {AttentionKernel::Flash, AttentionKernel::Reference}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      for (int64_t d : {64, 128}) {
        for (bool causal : {true, false}) {
          for (const Dims& s : shapes) {
            if (causal && s.sq != s.sk) continue;
            for (float scale : scale_of(d)) {
              out.push_back({test, kernel, dt, s.b, s.h, s.sq, s.sk, d, causal, scale, chain,
                             chain ? chain_tol16(dt) : tol16(dt), lse_tol16()});
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Case> kernel_cases() {
  std::vector<Dims> shapes;
  for (int64_t n : {1, 17, 64, 100, 257}) shapes.push_back({1, 2, n, n});
  shapes.push_back({2, 3, 70, 70});
  shapes.push_back({1, 2, 17, 100});
  shapes.push_back({1, 1, 257, 33});
  return flash_grid("kernels", shapes, false,
                    [](int64_t d) { return std::vector<float>{default_scale(d)}; });
}

std::vector<Case> sanitize_cases() {
  std::vector<Case> out;
  for (const Case& c : kernel_cases()) {
    if (c.b == 1 && c.h == 2 && c.sk == 100 && c.causal == (c.sq == 100)) out.push_back(c);
  }
  return out;
}

std::vector<Case> scale_cases() {
  return flash_grid("scale", {{1, 2, 100, 100}, {1, 1, 70, 150}}, false, [](int64_t) {
    return std::vector<float>{0.3f, 0.04f};
  });
}

std::vector<Case> chain_cases() {
  return flash_grid("chain", {{1, 2, 257, 257}, {2, 3, 70, 70}, {1, 2, 17, 100}}, true,
                    [](int64_t d) { return std::vector<float>{default_scale(d)}; });
}

std::vector<Case> reference_cases() {
  std::vector<Case> out;
  const Dims shapes[] = {{1, 1, 1, 1},     {1, 2, 17, 17},   {2, 3, 70, 70},
                         {1, 2, 130, 130}, {2, 2, 300, 300}, {1, 1, 9, 23}};
  const int64_t dims[] = {1, 8, 13, 64, 128, 32};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (bool causal : {true, false}) {
      for (size_t i = 0; i < std::size(shapes); ++i) {
        const Dims& s = shapes[i];
        if (causal && s.sq != s.sk) continue;
        out.push_back({"reference", AttentionKernel::Reference, dt, s.b, s.h, s.sq, s.sk, dims[i],
                       causal, default_scale(dims[i]), false, reference_tol(dt),
                       reference_lse_tol()});
      }
    }
  }
  return out;
}

Case long_case() {
  const DType dt = DType::bf16;
  return {"long", AttentionKernel::Flash, dt,         1, 1, 4096, 4096, 64, true, default_scale(64),
          true,   chain_tol16(dt),        lse_tol16()};
}

Inputs make_inputs(Host& h, const Case& c) {
  return {rand_tensor(h, c.q_shape(), c.dt, 1, -2, 2), rand_tensor(h, c.k_shape(), c.dt, 2, -2, 2),
          rand_tensor(h, c.k_shape(), c.dt, 3), rand_tensor(h, c.q_shape(), c.dt, 4)};
}

HostRun run_host(Host& h, const Case& c, const Inputs& in) {
  HostRun r{h.ctx.empty(c.q_shape(), c.dt), h.ctx.empty(c.lse_shape(), DType::f32),
            h.ctx.empty(c.q_shape(), c.dt), h.ctx.empty(c.k_shape(), c.dt),
            h.ctx.empty(c.k_shape(), c.dt)};
  ops::attention_fwd(h.ctx, h.s(), in.q, in.k, in.v, r.out, r.lse, c.scale, c.causal);
  ops::attention_bwd(h.ctx, h.s(), in.q, in.k, in.v, r.out, in.dout, r.lse, r.dq, r.dk, r.dv,
                     c.scale, c.causal);
  return r;
}

Tensor Gpu::up(const Tensor& t) {
  host.sync();
  return t.to(ctx.allocator_ptr(), s());
}

Vec Gpu::down(const Tensor& d) {
  Tensor h = d.to(host.ctx.allocator_ptr(), s());
  ctx.synchronize();
  return h.to_vector();
}

std::string Gpu::bytes(const Tensor& d) {
  Tensor h = d.to(host.ctx.allocator_ptr(), s());
  ctx.synchronize();
  return std::string(static_cast<const char*>(h.data_ptr()), h.nbytes());
}

void check_on_gpu(Gpu& g, const Case& c) {
  ops::set_attention_kernel(c.kernel);
  REQUIRE(ops::cuda_attention_kernel(c.dt, c.d) == c.kernel);
  Host& h = g.host;
  const Inputs in = make_inputs(h, c);
  const HostRun want = run_host(h, c, in);
  Tensor Q = g.up(in.q), K = g.up(in.k), V = g.up(in.v), dO = g.up(in.dout);
  Tensor O = g.ctx.empty(c.q_shape(), c.dt), L = g.ctx.empty(c.lse_shape(), DType::f32);
  if (c.kernel == AttentionKernel::Flash) {
    // Flash needs 16-byte aligned tensors; otherwise this would test the reference.
    for (const Tensor* t : {&Q, &K, &V, &dO, &O}) {
      REQUIRE(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
    }
  }
  const std::string w = c.name();
  ops::attention_fwd(g.ctx, g.s(), Q, K, V, O, L, c.scale, c.causal);
  check_close(g.down(O), read(h, want.out), c.tol.tol, "attention out " + w, c.tol.floor(c.d));
  check_close(g.down(L), read(h, want.lse), c.lse.tol, "attention lse " + w, c.lse.floor(1));
  // The backward from the host's out and lse (only the backward kernels differ), or from the
  // GPU's own (as training runs it).
  Tensor Ob = c.chain ? O : g.up(want.out), Lb = c.chain ? L : g.up(want.lse);
  Tensor dQ = g.ctx.empty(c.q_shape(), c.dt), dK = g.ctx.empty(c.k_shape(), c.dt),
         dV = g.ctx.empty(c.k_shape(), c.dt);
  ops::attention_bwd(g.ctx, g.s(), Q, K, V, Ob, dO, Lb, dQ, dK, dV, c.scale, c.causal);
  const Tol t = c.dqdk_tol();
  check_close(g.down(dQ), read(h, want.dq), t.tol, "attention dq " + w, t.floor(c.d));
  check_close(g.down(dK), read(h, want.dk), t.tol, "attention dk " + w, t.floor(c.d));
  check_close(g.down(dV), read(h, want.dv), c.tol.tol, "attention dv " + w, c.tol.floor(c.d));
}

}  // namespace kt::attn
