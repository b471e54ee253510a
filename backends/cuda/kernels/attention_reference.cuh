// Today's CUDA attention kernels, the reference path (flash-attention's algorithm on CUDA cores,
// f32 math from shared memory): forward keeps K/V tiles in shared memory and an online softmax
// per query row, saving the logsumexp; backward recomputes probabilities from it, with one kernel
// for dQ (per query tile) and one for dK / dV (per key tile), so nothing is accumulated
// atomically. Included once per dtype (attention_reference_<dtype>.cu).
#pragma once

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/common.cuh"

namespace meshrt::kernels::cuda {

namespace reference {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 4;        // forward / dQ: warps per block
constexpr int kRowsPerWarp = 4;  // forward / dQ: query rows per warp
constexpr int kBr = kWarps * kRowsPerWarp;
constexpr int kBc = 32;  // keys per tile: one per lane
constexpr int kKvWarps = 8;
constexpr int kKeysPerWarp = 4;  // dK/dV: each warp owns 4 keys of the block's 32
constexpr int kQc = 16;          // dK/dV: query rows staged per step

// Odd row stride for tiles read as Ks[lane][c] (lanes walk rows): no bank conflicts.
__host__ __device__ inline int odd_ld(int d) { return d | 1; }

// Loads rows [r0, r0 + rows) of a [*, d] head as f32 into a tile with row stride ld (zero rows
// past `limit`), optionally scaled.
template <class T>
__device__ __forceinline__ void load_tile(float* dst, int ld, const T* head, int64_t r0, int rows,
                                          int64_t limit, int d, float mul) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d, c = idx - r * d;
    const int64_t row = r0 + r;
    dst[r * ld + c] = row < limit ? mul * load_f32(head, row * d + c) : 0.f;
  }
}

template <class T, int NC>
__global__ void __launch_bounds__(kWarps * 32)
    attn_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    T* __restrict__ out, float* __restrict__ lse, AttnArgs a) {
  extern __shared__ float sm[];
  const int d = a.d, ld = odd_ld(d);
  float* Ks = sm;
  float* Vs = Ks + kBc * ld;
  float* Qs = Vs + kBc * ld;
  const int64_t bh = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* kh = k + bh * a.sk * d;
  const T* vh = v + bh * a.sk * d;
  load_tile(Qs, d, q + bh * a.sq * d, q0, kBr, a.sq, d, a.scale);  // scores come out scaled

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][NC];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -kmath::kInf;
    l[rr] = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[rr][c] = 0.f;
  }
  const int64_t q_last = (q0 + kBr < a.sq ? q0 + kBr : a.sq) - 1;
  const int64_t k_end = a.causal ? attn_causal_key_end(a, q_last) : a.sk;
  for (int64_t k0 = 0; k0 < k_end; k0 += kBc) {
    __syncthreads();
    load_tile(Ks, ld, kh, k0, kBc, a.sk, d, 1.f);
    load_tile(Vs, ld, vh, k0, kBc, a.sk, d, 1.f);
    __syncthreads();
    const int64_t j = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t i = q0 + r;
      if (i >= a.sq) continue;  // warp-uniform
      float s = -kmath::kInf;
      if (attn_visible(a, bh, i, j)) {
        const float* qr = Qs + r * d;
        const float* kr = Ks + lane * ld;
        float acc = 0.f;
        for (int c = 0; c < d; ++c) acc += qr[c] * kr[c];
        s = acc;
      }
      const float mn = fmaxf(m[rr], warp_max(s));
      if (mn == -kmath::kInf) continue;  // warp-uniform: no visible key yet
      const float p = kmath::exp_diff(s, mn);
      const float alpha = kmath::exp_diff(m[rr], mn);
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = mn;
#pragma unroll
      for (int c = 0; c < NC; ++c) o[rr][c] *= alpha;
      for (int jj = 0; jj < kBc; ++jj) {
        const float pj = __shfl_sync(kFull, p, jj);
        const float* vr = Vs + jj * ld;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int col = lane + 32 * c;
          if (col < d) o[rr][c] += pj * vr[col];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kRowsPerWarp + rr;
    if (i >= a.sq) continue;
    const float inv = l[rr] > 0.f ? 1.0f / l[rr] : 0.f;
    T* orow = out + (bh * a.sq + i) * d;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col < d) store_f32(orow, col, o[rr][c] * inv);
    }
    if (lane == 0) lse[bh * a.sq + i] = kmath::softmax_lse(kmath::SoftmaxState{m[rr], l[rr]});
  }
}

template <class T, int NC>
__global__ void __launch_bounds__(kWarps * 32)
    attn_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ dvec, T* __restrict__ dq, AttnArgs a) {
  extern __shared__ float sm[];
  const int d = a.d, ld = odd_ld(d);
  float* Ks = sm;
  float* Vs = Ks + kBc * ld;
  float* Qs = Vs + kBc * ld;
  float* dOs = Qs + kBr * d;
  const int64_t bh = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* kh = k + bh * a.sk * d;
  const T* vh = v + bh * a.sk * d;
  load_tile(Qs, d, q + bh * a.sq * d, q0, kBr, a.sq, d, a.scale);
  load_tile(dOs, d, dout + bh * a.sq * d, q0, kBr, a.sq, d, 1.f);

  float L[kRowsPerWarp], D[kRowsPerWarp], acc[kRowsPerWarp][NC];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kRowsPerWarp + rr;
    L[rr] = i < a.sq ? lse[bh * a.sq + i] : 0.f;
    D[rr] = i < a.sq ? dvec[bh * a.sq + i] : 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[rr][c] = 0.f;
  }
  const int64_t q_last = (q0 + kBr < a.sq ? q0 + kBr : a.sq) - 1;
  const int64_t k_end = a.causal ? attn_causal_key_end(a, q_last) : a.sk;
  for (int64_t k0 = 0; k0 < k_end; k0 += kBc) {
    __syncthreads();
    load_tile(Ks, ld, kh, k0, kBc, a.sk, d, 1.f);
    load_tile(Vs, ld, vh, k0, kBc, a.sk, d, 1.f);
    __syncthreads();
    const int64_t j = k0 + lane;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t i = q0 + r;
      if (i >= a.sq) continue;
      float ds = 0.f;
      if (attn_visible(a, bh, i, j)) {
        const float* qr = Qs + r * d;
        const float* gr = dOs + r * d;
        const float* kr = Ks + lane * ld;
        const float* vr = Vs + lane * ld;
        float s = 0.f, dp = 0.f;
        for (int c = 0; c < d; ++c) {
          s += qr[c] * kr[c];
          dp += gr[c] * vr[c];
        }
        const float p = kmath::exp_f32(s - L[rr]);
        ds = p * (dp - D[rr]);
      }
      for (int jj = 0; jj < kBc; ++jj) {
        const float dsj = __shfl_sync(kFull, ds, jj);
        const float* kr = Ks + jj * ld;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int col = lane + 32 * c;
          if (col < d) acc[rr][c] += dsj * kr[col];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kRowsPerWarp + rr;
    if (i >= a.sq) continue;
    T* row = dq + (bh * a.sq + i) * d;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col < d) store_f32(row, col, a.scale * acc[rr][c]);
    }
  }
}

template <class T, int NC>
__global__ void __launch_bounds__(kKvWarps * 32)
    attn_bwd_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const T* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ dvec, T* __restrict__ dk, T* __restrict__ dv,
                         AttnArgs a) {
  extern __shared__ float sm[];
  const int d = a.d;
  float* Ks = sm;             // [kBc][d]
  float* Vs = Ks + kBc * d;   // [kBc][d]
  float* Qs = Vs + kBc * d;   // [kQc][d], unscaled
  float* dOs = Qs + kQc * d;  // [kQc][d]
  float* Ls = dOs + kQc * d;  // [kQc]
  float* Ds = Ls + kQc;       // [kQc]
  const int64_t bh = blockIdx.y;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBc;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* qh = q + bh * a.sq * d;
  const T* gh = dout + bh * a.sq * d;
  load_tile(Ks, d, k + bh * a.sk * d, k0, kBc, a.sk, d, 1.f);
  load_tile(Vs, d, v + bh * a.sk * d, k0, kBc, a.sk, d, 1.f);

  float gk[kKeysPerWarp][NC], gv[kKeysPerWarp][NC];
#pragma unroll
  for (int jj = 0; jj < kKeysPerWarp; ++jj) {
#pragma unroll
    for (int c = 0; c < NC; ++c) gk[jj][c] = gv[jj][c] = 0.f;
  }
  // Causal: query rows before k0 - delta see none of this block's keys.
  const int64_t q_first = a.causal && k0 - a.delta > 0 ? k0 - a.delta : 0;
  const int64_t q_begin = (q_first / kQc) * kQc;
  for (int64_t qc = q_begin; qc < a.sq; qc += kQc) {
    __syncthreads();
    load_tile(Qs, d, qh, qc, kQc, a.sq, d, 1.f);
    load_tile(dOs, d, gh, qc, kQc, a.sq, d, 1.f);
    if (threadIdx.x < kQc) {
      const int64_t i = qc + threadIdx.x;
      Ls[threadIdx.x] = i < a.sq ? lse[bh * a.sq + i] : 0.f;
      Ds[threadIdx.x] = i < a.sq ? dvec[bh * a.sq + i] : 0.f;
    }
    __syncthreads();
    const int rows = a.sq - qc < kQc ? static_cast<int>(a.sq - qc) : kQc;
    for (int r = 0; r < rows; ++r) {
      const int64_t i = qc + r;
      const float* qr = Qs + r * d;
      const float* gr = dOs + r * d;
      float ps[kKeysPerWarp], pd[kKeysPerWarp];
#pragma unroll
      for (int jj = 0; jj < kKeysPerWarp; ++jj) {
        const int kk = warp * kKeysPerWarp + jj;
        ps[jj] = 0.f;
        pd[jj] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int col = lane + 32 * c;
          if (col < d) {
            ps[jj] += qr[col] * Ks[kk * d + col];
            pd[jj] += gr[col] * Vs[kk * d + col];
          }
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int jj = 0; jj < kKeysPerWarp; ++jj) {
          ps[jj] += __shfl_xor_sync(kFull, ps[jj], off);
          pd[jj] += __shfl_xor_sync(kFull, pd[jj], off);
        }
      }
#pragma unroll
      for (int jj = 0; jj < kKeysPerWarp; ++jj) {
        const int64_t j = k0 + warp * kKeysPerWarp + jj;
        const bool valid = attn_visible(a, bh, i, j);
        const float p = valid ? kmath::exp_f32(a.scale * ps[jj] - Ls[r]) : 0.f;
        const float ds = p * (pd[jj] - Ds[r]);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int col = lane + 32 * c;
          if (col < d) {
            gv[jj][c] += p * gr[col];
            gk[jj][c] += ds * qr[col];
          }
        }
      }
    }
  }
#pragma unroll
  for (int jj = 0; jj < kKeysPerWarp; ++jj) {
    const int64_t j = k0 + warp * kKeysPerWarp + jj;
    if (j >= a.sk) continue;
    T* krow = dk + (bh * a.sk + j) * d;
    T* vrow = dv + (bh * a.sk + j) * d;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col < d) {
        store_f32(krow, col, a.scale * gk[jj][c]);
        store_f32(vrow, col, gv[jj][c]);
      }
    }
  }
}

// Calls f(std::integral_constant<int, NC>) with NC = 32-column groups covering head_dim.
template <class F>
void dispatch_nc(int d, F&& f) {
  if (d <= 32) {
    f(std::integral_constant<int, 1>{});
  } else if (d <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (d <= 96) {
    f(std::integral_constant<int, 3>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 4>{});
  } else if (d <= 192) {
    f(std::integral_constant<int, 6>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

}  // namespace reference

template <class T>
void reference_attention_fwd(const AttnArgs& a, const T* q, const T* k, const T* v, T* out,
                             float* lse, cudaStream_t st) {
  using namespace reference;
  const size_t smem = (2 * kBc * odd_ld(a.d) + kBr * a.d) * sizeof(float);
  dispatch_nc(a.d, [&](auto nc) {
    constexpr int NC = decltype(nc)::value;
    auto kernel = attn_fwd_kernel<T, NC>;
    set_smem(kernel, smem);
    kernel<<<dim3(attn_tiles(a.sq, kBr), static_cast<unsigned>(a.bh)), kWarps * 32, smem, st>>>(
        q, k, v, out, lse, a);
  });
  MESHRT_CUDA_CHECK_LAUNCH("attention_fwd<" << attn_dtype_name<T>() << ", d=" << a.d << ">");
}

template <class T>
void reference_attention_bwd(const AttnArgs& a, const T* q, const T* k, const T* v, const T* dout,
                             const float* lse, const float* dvec, T* dq, T* dk, T* dv,
                             cudaStream_t st) {
  using namespace reference;
  dispatch_nc(a.d, [&](auto nc) {
    constexpr int NC = decltype(nc)::value;
    const size_t smem_q = (2 * kBc * odd_ld(a.d) + 2 * kBr * a.d) * sizeof(float);
    auto kq = attn_bwd_dq_kernel<T, NC>;
    set_smem(kq, smem_q);
    kq<<<dim3(attn_tiles(a.sq, kBr), static_cast<unsigned>(a.bh)), kWarps * 32, smem_q, st>>>(
        q, k, v, dout, lse, dvec, dq, a);
    MESHRT_CUDA_CHECK_LAUNCH("attention_bwd_dq<" << attn_dtype_name<T>() << ", d=" << a.d << ">");
    if (a.sk == 0) return;
    const size_t smem_kv = (2 * kBc * a.d + 2 * kQc * a.d + 2 * kQc) * sizeof(float);
    auto kkv = attn_bwd_dkdv_kernel<T, NC>;
    set_smem(kkv, smem_kv);
    kkv<<<dim3(attn_tiles(a.sk, kBc), static_cast<unsigned>(a.bh)), kKvWarps * 32, smem_kv, st>>>(
        q, k, v, dout, lse, dvec, dk, dv, a);
    MESHRT_CUDA_CHECK_LAUNCH("attention_bwd_dkdv<" << attn_dtype_name<T>() << ", d=" << a.d << ">");
  });
}

// Each attention_reference_<dtype>.cu instantiates the launchers for its dtype.
#define MESHRT_REFERENCE_ATTENTION(T)                                                         \
  template void reference_attention_fwd<T>(const AttnArgs&, const T*, const T*, const T*, T*, \
                                           float*, cudaStream_t);                             \
  template void reference_attention_bwd<T>(const AttnArgs&, const T*, const T*, const T*,     \
                                           const T*, const float*, const float*, T*, T*, T*,  \
                                           cudaStream_t)

}  // namespace meshrt::kernels::cuda
