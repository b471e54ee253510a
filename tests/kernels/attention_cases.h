// The CUDA attention tests' cases, inputs and tolerances, defined once: the [cuda] tests
// (test_cuda.cpp, test_cuda_attention.cpp) run these cases under these tolerances, and the unit
// test test_attention_twin.cpp runs the same cases through host twins of the kernels' numerics
// (attention_twin.h) and requires every tolerance to hold with margin (kMargin) on every CI run,
// without a GPU. A tolerance, shape or input changed here changes both.
#pragma once

#include <string>
#include <vector>

#include "attention_twin.h"
#include "helpers.h"
#include "kernels/ops.h"

namespace kt::attn {

using meshrt::ops::AttentionKernel;

// |got - want| <= tol * (|want| + rms_frac * rms(want) + row_frac * rms(want's row) + abs),
// elementwise (check_close; a row is head_dim elements, one query or key).
struct Tol {
  double tol, rms_frac;
  double row_frac = 0;
  double abs = 0;
  Floor floor(int64_t row_len) const {
    return {rms_frac, abs, row_frac > 0 ? row_len : 0, row_frac};
  }
};

// dQ and dK with one key (seq_k = 1) are exactly zero (softmax over one key is constant) and both
// sides hold only f32 cancellation noise (~1e-6: dP - D of terms up to ~30), so the rms floor is
// noise too and the relative check would compare noise with noise: an absolute floor of 2e-3
// (allowing 6e-5 for bf16, 8e-6 for f16) instead.
constexpr double kOneKeyAbsFloor = 2e-3;

// Every tolerance below keeps the twins' worst error at or under this fraction of it (checked
// by test_attention_twin.cpp), for the GPU's last bits the twins do not model (tensor-core
// accumulation order, the GPU's exp2f) and for the GPU's own draw of the same rounding noise.
constexpr double kMargin = 0.5;

// Unit roundoff u of a 16-bit dtype: bf16 2^-8, f16 2^-11.
double unit_roundoff(DType dt);

// Outputs and gradients of flash or the reference against the host on 16-bit inputs: 8u, with a
// floor of the element's row rms plus a tenth of the tensor's rms. Host and GPU start from the
// same 16-bit inputs and each round the result once (up to one ulp, 2u of the element, apart).
// Flash also rounds P and dS to 16 bits before the second product of each pair: relative u per
// term, summed over the keys (or queries) with mixed signs, so an element's error scales with
// the size of its terms rather than with the element (a gradient element that cancels to near
// zero keeps the error of its terms). The row's rms measures that size: with the causal mask at
// long sequences it varies by orders of magnitude from the first rows to the last, which a floor
// of the tensor's rms alone does not follow (the twin's 4k bf16 dv then reaches 1.4x of 8u).
// The tenth of the tensor's rms absorbs rows that cancel entirely (row 0 of a causal dQ sees one
// key). Twin margins (test_attention_twin.cpp): flash at most ~0.26 of this, the reference
// ~0.17; an indexing, masking or scale error moves elements by O(their row's rms) and fails by
// a factor of ~30 (bf16) or ~250 (f16); a wrong scale measures 26x (out) and 45x (dq).
Tol tol16(DType dt);
// The same when the backward reads each side's own out and lse (the GPU forward feeding the GPU
// backward): D = dO . out then carries each side's rounding of out (u relative), which moves dS
// by P * dD and dQ by scale * dD * (P K)_row: the size of the tensor's dQ, not of the row's (in
// early causal rows dS nearly cancels), so the floor is the whole tensor's rms plus the row's.
// Twin margins: at most ~0.31 (bf16 dQ; 0.64 with a tenth of the tensor's rms).
Tol chain_tol16(DType dt);
// lse: f32 math on both sides from the same inputs; only accumulation order, exp2 / log2-domain
// rescaling and library exp / log differ (~1e-6 absolute, ~1e-7 of |lse| + rms); dropping or
// adding one key of 257 moves it by ~1e-3.
Tol lse_tol16();
// test_cuda.cpp's "cuda fused attention matches the host", pinned to the reference kernel (flash
// is covered by test_cuda_attention.cpp): f32 math on both sides, each result rounded once, so
// 16-bit results are at most one ulp (2u = 0.8% for bf16) apart: 3e-2 with a 0.1 rms floor (twin
// margins ~0.24). That floor is too small for flash's rounded P and dS (the flash twin exceeds
// it by 3.1x / 3.7x on bf16 gradients, the failure the first GPU run would have shown), which is
// why this test runs the reference only. f32: accumulation order only, on both sides: the host's
// order depends on its ISA. At 1e-4 the twin's worst margin against the host was 0.42 on an
// AVX-512 host and 0.82 on an AVX2 one (dv at [2, 2, 300, 128], 0.63 of it against float64), so
// 2e-4: margins <= ~0.41; a wrong index or scale is still ~1000x over.
Tol reference_tol(DType dt);
Tol reference_lse_tol();

// One comparison a [cuda] test makes, and the tolerances it makes it under.
struct Case {
  std::string test;  // the [cuda] test that runs it
  AttentionKernel kernel;
  DType dt;
  int64_t b, h, sq, sk, d;
  bool causal;
  float scale;
  bool chain;  // backward from the GPU's own out / lse (else from the host's, like the host)
  Tol tol, lse;

  Shape q_shape() const { return {b, h, sq, d}; }
  Shape k_shape() const { return {b, h, sk, d}; }
  Shape lse_shape() const { return {b, h, sq}; }
  AttnProblem problem() const { return {b * h, sq, sk, d, scale, causal}; }
  // The tolerance of dQ and dK: tol, with kOneKeyAbsFloor for seq_k = 1.
  Tol dqdk_tol() const {
    Tol t = tol;
    if (sk == 1) t.abs = kOneKeyAbsFloor;
    return t;
  }
  std::string name() const;  // kernel, dtype, mask, shapes, scale
};

// "cuda attention kernels match the host (flash and reference)": sequence lengths around the
// tiles (64 query rows / keys, 32-row backward query tiles), several heads, seq_q != seq_k
// without the mask; scale 1/sqrt(head_dim); backward from the host's out and lse.
std::vector<Case> kernel_cases();
// "cuda attention kernels under compute-sanitizer (small shapes)", the attention cases
// tools/gpu-check.sh runs under memcheck and racecheck: the kernel_cases() at 100 x 100 causal
// and 17 x 100 full, which reach every tile edge and mask in a few blocks.
std::vector<Case> sanitize_cases();
// "cuda attention with a non-default softmax scale matches the host": scales 0.3 and 0.04 (not
// 1/sqrt(head_dim) = 0.125 / 0.088), so mixing up scale and 1/sqrt(d) fails.
std::vector<Case> scale_cases();
// "cuda attention: the GPU forward feeds the GPU backward": out and lse from the GPU kernel.
std::vector<Case> chain_cases();
// test_cuda.cpp "cuda fused attention matches the host" (reference kernel, every dtype, odd head
// dims).
std::vector<Case> reference_cases();
// "cuda flash attention at a 4k sequence matches the host": bf16, causal, head_dim 64, the GPU
// forward feeding the backward, every element compared (the twin, too: ~10 s on one core).
Case long_case();

// The inputs of every case: q, k uniform in [-2, 2) (seeds 1, 2), v and dout in [-1, 1) (3, 4),
// rounded to the dtype.
struct Inputs {
  Tensor q, k, v, dout;
};
Inputs make_inputs(Host& h, const Case& c);

// The host's results, which the [cuda] tests compare against: forward, then backward from the
// host's own out and lse.
struct HostRun {
  Tensor out, lse, dq, dk, dv;
};
HostRun run_host(Host& h, const Case& c, const Inputs& in);

// cuda:0 next to the host rank, for the [cuda] tests.
struct Gpu {
  Host host;
  Context ctx{Device::cuda(0)};
  Stream& s() { return ctx.compute_stream(); }
  Tensor up(const Tensor& t);          // a host tensor's copy on the GPU
  Vec down(const Tensor& d);           // a GPU tensor's values
  std::string bytes(const Tensor& d);  // a GPU tensor's bytes
};

// Runs case c on the GPU under its kernel setting (the caller keeps a KernelSetting) and checks
// out, lse and the gradients against the host under c's tolerances.
void check_on_gpu(Gpu& g, const Case& c);

// Restores the process-wide attention kernel setting when a test ends.
struct KernelSetting {
  AttentionKernel saved = meshrt::ops::attention_kernel();
  ~KernelSetting() { meshrt::ops::set_attention_kernel(saved); }
};

}  // namespace kt::attn
