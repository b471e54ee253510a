// Per-element and per-row math shared by the host and CUDA kernels (MESHRT_HD functions).
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/half.h"
#include "runtime/hd.h"
#include "runtime/philox.h"

namespace meshrt::kmath {

constexpr float kInf = __builtin_huge_valf();
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi), GPT-2 tanh GeLU
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1/sqrt(2 pi)

MESHRT_HD float max_f(float a, float b) { return a > b ? a : b; }

// exp(x) for f32. On the host this is a branch-free polynomial (max error ~2 ulp over the
// normal range) so that loops calling it vectorize; libm's expf is a scalar call. exp(-inf) = 0
// exactly, which masked softmax entries rely on; results below ~1e-38 flush to 0 and inputs
// above 88 saturate at exp(88) (callers only use it for x <= 0 or inside tanh).
MESHRT_HD float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 split so that n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const bool underflow = x < -87.33f;
  float xc = x > 88.0f ? 88.0f : x;
  xc = xc < -87.33f ? -87.33f : xc;
  float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  // Taylor to degree 7 on |r| <= ln2/2: truncation error < 6e-9 relative.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // NaN in gives NaN out through p; converting a NaN n would be undefined (UBSan), so 0 instead.
  int32_t ni = static_cast<int32_t>(n == n ? n : 0.0f);
  float scale = bits_f32(static_cast<uint32_t>(ni + 127) << 23);
  float y = p * scale;
  return underflow ? 0.0f : y;
#endif
}

// tanh through exp_f32 on the host (absolute error ~1e-7, which is what GeLU's 1 + tanh needs).
MESHRT_HD float tanh_f32(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  float ax = x < 0.f ? -x : x;
  float e = exp_f32(-2.0f * ax);  // in (0, 1]
  float t = (1.0f - e) / (1.0f + e);
  return x < 0.f ? -t : t;
#endif
}

MESHRT_HD float erf_f32(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  return std::erf(x);
#endif
}

MESHRT_HD float sqrt_f32(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

MESHRT_HD float log_f32(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

// ---- GeLU ---------------------------------------------------------------------------------------

// 1 + tanh(u) and 1 - tanh(u)^2 from e = exp(-2|u|), without the cancellation of forming tanh
// first: 1 + t is 2/(1+e) for u >= 0 and 2e/(1+e) for u < 0; 1 - t^2 = 4e/(1+e)^2.
struct TanhParts {
  float one_plus_t;
  float sech2;
};
MESHRT_HD TanhParts tanh_parts(float u) {
  float e = exp_f32(-2.0f * (u < 0.f ? -u : u));
  float inv = 1.0f / (1.0f + e);
  TanhParts p;
  p.one_plus_t = 2.0f * (u < 0.f ? e : 1.0f) * inv;
  p.sech2 = 4.0f * e * inv * inv;
  return p;
}

// GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as
// x / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh u) is the logistic of 2u): one exp, no
// |u|, faster on the host than through tanh_parts. Below u = -44 the result is under 1e-37 and
// exp_f32 saturates at exp(88) (x / exp(88) would not go to zero for huge |x|): zero of x's sign.
MESHRT_HD float gelu_tanh(float x) {
  float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  float g = x / (1.0f + exp_f32(-2.0f * u));
  return u < -44.0f ? 0.0f * x : g;
}

MESHRT_HD float gelu_tanh_grad(float x) {
  float x2 = x * x;
  float u = kSqrt2OverPi * (x + kGeluCubic * x2 * x);
  TanhParts t = tanh_parts(u);
  float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x2);
  return 0.5f * t.one_plus_t + 0.5f * x * t.sech2 * du;
}

// Exact GeLU: x * Phi(x).
MESHRT_HD float gelu_erf(float x) { return 0.5f * x * (1.0f + erf_f32(x * kInvSqrt2)); }

MESHRT_HD float gelu_erf_grad(float x) {
  float cdf = 0.5f * (1.0f + erf_f32(x * kInvSqrt2));
  float pdf = kInvSqrt2Pi * exp_f32(-0.5f * x * x);
  return cdf + x * pdf;
}

// ---- Welford (mean / variance) ------------------------------------------------------------------

struct Welford {
  float mean = 0.f;
  float m2 = 0.f;  // sum of squared deviations from the mean
  float count = 0.f;
};

MESHRT_HD void welford_add(Welford& w, float x) {
  w.count += 1.0f;
  float d = x - w.mean;
  w.mean += d / w.count;
  w.m2 += d * (x - w.mean);
}

// Chan et al.'s parallel merge; either side may be empty.
MESHRT_HD Welford welford_merge(const Welford& a, const Welford& b) {
  float n = a.count + b.count;
  if (n == 0.f) return a;
  float d = b.mean - a.mean;
  float fb = b.count / n;
  Welford r;
  r.count = n;
  r.mean = a.mean + d * fb;
  r.m2 = a.m2 + b.m2 + d * d * a.count * fb;
  return r;
}

// Biased (population) variance, as LayerNorm uses.
MESHRT_HD float welford_var(const Welford& w) { return w.count > 0.f ? w.m2 / w.count : 0.f; }

// ---- online softmax -----------------------------------------------------------------------------

// Running (max, sum of exp(x - max)) over a row seen in pieces.
struct SoftmaxState {
  float m = -kInf;
  float l = 0.f;
};

// exp(a - b) that is 0 when a is -inf (including -inf - -inf, which would be NaN).
MESHRT_HD float exp_diff(float a, float b) { return a == -kInf ? 0.0f : exp_f32(a - b); }

// Merges two partial states of the same row.
MESHRT_HD SoftmaxState softmax_merge(const SoftmaxState& a, const SoftmaxState& b) {
  SoftmaxState r;
  r.m = max_f(a.m, b.m);
  r.l = a.l * exp_diff(a.m, r.m) + b.l * exp_diff(b.m, r.m);
  return r;
}

// Folds one value into the state.
MESHRT_HD void softmax_add(SoftmaxState& s, float x) {
  float m = max_f(s.m, x);
  s.l = s.l * exp_diff(s.m, m) + exp_diff(x, m);
  s.m = m;
}

// log(sum exp) of a state; -inf for an empty row.
MESHRT_HD float softmax_lse(const SoftmaxState& s) {
  return s.l > 0.f ? s.m + log_f32(s.l) : -kInf;
}

// ---- dropout (Philox) ---------------------------------------------------------------------------

// Keep decision of element `index` for dropout with probability p: uniform word `index % 4` of
// the Philox draw at counter index / 4 under key `seed` and stream `offset`. Four consecutive
// elements share one draw.
MESHRT_HD bool dropout_keep_word(uint32_t word, float p) { return philox_u01(word) >= p; }

MESHRT_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t index, float p) {
  Philox4 r = philox_draw(seed, offset, index >> 2);
  return dropout_keep_word(r.v[index & 3u], p);
}

// ---- optimizers ---------------------------------------------------------------------------------

// Scalars of one AdamW step, computed once per call (bias corrections folded in).
struct AdamWScalars {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float bc2_sqrt_inv;  // 1 / sqrt(1 - beta2^t)
  float grad_scale;
};

// One element of AdamW (decoupled weight decay, PyTorch semantics); m and v are updated in place.
MESHRT_HD float adamw_step(float p, float g, float& m, float& v, const AdamWScalars& c) {
  g *= c.grad_scale;
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  float denom = sqrt_f32(v) * c.bc2_sqrt_inv + c.eps;
  return p * c.decay - c.step_size * (m / denom);
}

struct SgdScalars {
  float lr;
  float momentum;
  float dampening;
  float weight_decay;
  float grad_scale;
  bool nesterov;
  bool init_buffers;  // first step: buf = g (PyTorch), ignoring dampening
};

MESHRT_HD float sgd_step(float p, float g, float& buf, const SgdScalars& c) {
  g = g * c.grad_scale + c.weight_decay * p;
  buf = c.init_buffers ? g : c.momentum * buf + (1.0f - c.dampening) * g;
  float d = c.nesterov ? g + c.momentum * buf : buf;
  return p - c.lr * d;
}

// ---- storage rounding ---------------------------------------------------------------------------

// The value x takes once stored as T (identity for float): what a reference must compare against.
template <class T>
MESHRT_HD float round_to(float x) {
  if constexpr (sizeof(T) == 2) {
    return T::from_float(x).to_float();
  } else {
    return x;
  }
}

}  // namespace meshrt::kmath
