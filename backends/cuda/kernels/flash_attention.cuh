// FlashAttention-2 on tensor cores: mma.sync m16n8k16 (16-bit inputs, f32 accumulation) with
// tiles staged in shared memory, for bf16 / f16 and head_dim 64 or 128. Included once per dtype
// (flash_attention_<dtype>.cu).
//
// Forward: a block owns 64 query rows (16 per warp) and walks the key tiles (64 keys) with an
// online softmax in the log2 domain; causal blocks stop at their last row's key, and lse is
// saved as the reference kernel saves it. Backward: D = rowsum(dO * O) comes from the caller;
// one kernel per key block accumulates dK and dV in registers over the query tiles, and a
// separate kernel per query block accumulates dQ over the key tiles. dQ by a second pass rather
// than atomics: it recomputes two of the seven tile products, but every gradient is written once
// by one thread, so results are deterministic and no f32 dQ buffer or conversion pass is needed.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16/.f16), with g = lane / 4 and t = lane % 4:
//   A (16 x 16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16 x 8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C (16 x 8, f32):  c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// Each 32-bit register holds two consecutive k elements, the lower k in the low half. So an
// operand is read with one 32-bit shared load when its k dimension is contiguous in shared memory:
// tiles used with k = head_dim are stored [row][d], those with k = a sequence index transposed
// [d][row]. Two C tiles side by side (keys 8c..8c+15) are exactly one A fragment, which is how
// probabilities go from one product into the next without shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backends/cuda/kernels/attention.cuh"
#include "kernels/math.h"

namespace meshrt::kernels::cuda {

namespace flash {

constexpr int kWarps = 4;
constexpr int kThreadsPerBlock = kWarps * 32;
constexpr int kRows = 64;   // forward / dQ: query rows per block (16 per warp)
constexpr int kKeys = 64;   // keys per tile (forward / dQ) or per block (dK / dV; 16 per warp)
constexpr int kQTile = 32;  // dK / dV: query rows per tile (bounds the accumulator registers)
// Shared-memory rows are padded by 8 elements (16 bytes): rows stay 16-byte aligned for vector
// stores, and the 8 rows x 4 words a fragment load touches fall in 32 distinct banks.
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Two floats as the 16-bit pair of one fragment register (lo in the low half), rounded to nearest.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  } else {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
  }
}

// c += a * b for one m16n8k16 tile.
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The two 16-bit elements at p, p + 1 (p even) as one register.
__device__ __forceinline__ uint32_t ld2(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment of the 16 x 16 block at `p` (its top-left element) of a row-major tile with row
// stride ld: rows are the m dimension, columns the k dimension.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* p, int ld, int g, int t) {
  a[0] = ld2(p + g * ld + 2 * t);
  a[1] = ld2(p + (g + 8) * ld + 2 * t);
  a[2] = ld2(p + g * ld + 2 * t + 8);
  a[3] = ld2(p + (g + 8) * ld + 2 * t + 8);
}

// c += A * B where B (16 x 8) is stored with n as rows and k contiguous: `p` points at (n 0, k 0)
// of a tile with row stride ld.
template <class T>
__device__ __forceinline__ void mma_b(float (&c)[4], const uint32_t (&a)[4], const uint16_t* p,
                                      int ld, int g, int t) {
  const uint16_t* r = p + g * ld + 2 * t;
  mma<T>(c, a, ld2(r), ld2(r + 8));
}

// The A fragment of rows x keys 16c..16c+15 from the C tiles 2c and 2c + 1 of the same rows.
template <class T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// Rows [r0, r0 + ROWS) of a [limit, D] head into dst[ROWS][ld] (zero rows past limit).
template <int D, int ROWS>
__device__ __forceinline__ void load_rows(uint16_t* dst, int ld, const uint16_t* head, int64_t r0,
                                          int64_t limit) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += blockDim.x) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < limit) val = *reinterpret_cast<const uint4*>(head + (r0 + r) * D + c);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = val;
  }
}

// The same rows stored transposed: dst[c][r] for column c < D, row r < ROWS (zero past limit).
// Consecutive threads take consecutive rows so that the 16-bit stores of a warp share banks
// pairwise instead of all landing in one.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows_t(uint16_t* dst, int ld, const uint16_t* head, int64_t r0,
                                            int64_t limit) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += blockDim.x) {
    const int r = idx % ROWS, c = (idx / ROWS) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < limit) val = *reinterpret_cast<const uint4*>(head + (r0 + r) * D + c);
    const uint32_t w[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dst[(c + 2 * i) * ld + r] = static_cast<uint16_t>(w[i] & 0xffffu);
      dst[(c + 2 * i + 1) * ld + r] = static_cast<uint16_t>(w[i] >> 16);
    }
  }
}

// Stores a C tile's row pair (cols 2t, 2t + 1) as two 16-bit values at p (p even).
template <class T>
__device__ __forceinline__ void store2(uint16_t* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = pack2<T>(lo, hi);
}

template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    fwd_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
               const uint16_t* __restrict__ v, uint16_t* __restrict__ out, float* __restrict__ lse,
               AttnArgs a) {
  constexpr int LD = D + kPad;       // Qs, Ks: [row][d]
  constexpr int LDT = kKeys + kPad;  // Vt: [d][key]
  extern __shared__ uint4 smem_vec[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_vec);  // [kRows][LD]
  uint16_t* Ks = Qs + kRows * LD;                        // [kKeys][LD]
  uint16_t* Vt = Ks + kKeys * LD;                        // [D][LDT]
  const int64_t bh = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = q0 + warp * 16;  // this warp's first query row
  const uint16_t* kh = k + bh * a.sk * D;
  const uint16_t* vh = v + bh * a.sk * D;

  load_rows<D, kRows>(Qs, LD, q + bh * a.sq * D, q0, a.sq);
  __syncthreads();
  uint32_t qf[D / 16][4];  // this warp's 16 query rows, as A fragments over d
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qf[kk], Qs + warp * 16 * LD + kk * 16, LD, g, t);

  // Row h of this thread: query row0 + g + 8h (C elements 2h, 2h + 1). m is in log2 units
  // (scores times scale * log2 e); l is this thread's share of the row sum, reduced at the end.
  float m[2] = {-kmath::kInf, -kmath::kInf}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  const float sl2 = a.scale * kLog2e;
  const int64_t q_last = (q0 + kRows < a.sq ? q0 + kRows : a.sq) - 1;
  const int64_t k_end = a.causal ? attn_causal_key_end(a, q_last) : a.sk;
  for (int64_t k0 = 0; k0 < k_end; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows<D, kKeys>(Ks, LD, kh, k0, a.sk);
    load_rows_t<D, kKeys>(Vt, LDT, vh, k0, a.sk);
    __syncthreads();
    float s[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        mma_b<T>(s[nt], qf[kk], Ks + nt * 8 * LD + kk * 16, LD, g, t);
      }
    }
    // Keys past sk, (causal) keys after the row and (doc-masked) keys of other documents get
    // -inf; warp-uniform test for whether this tile may have any.
    const bool mask =
        k0 + kKeys > a.sk || (a.causal && k0 + kKeys - 1 > row0 + a.delta) || a.q_doc != nullptr;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * sl2;
        if (mask) {
          const int64_t j = k0 + nt * 8 + 2 * t + (e & 1);
          const int64_t i = row0 + g + (e >> 1) * 8;
          if (!attn_visible(a, bh, i, j)) x = -kmath::kInf;
        }
        s[nt][e] = x;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -kmath::kInf;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      // The 4 threads of a group (same g) hold the row's 64 columns.
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      // A row with no visible key yet keeps p = 0 (exp2(-inf - 0)), never -inf - -inf.
      const float m_use = m_new == -kmath::kInf ? 0.f : m_new;
      const float alpha = exp2f(m[h] - m_use);
      m[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - m_use);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - m_use);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * h] *= alpha;
        o[dt][2 * h + 1] *= alpha;
      }
    }
    // O += P V: P (rows x keys) from the score tiles, V^T rows are d.
#pragma unroll
    for (int kc = 0; kc < kKeys / 16; ++kc) {
      uint32_t pa[4];
      c_to_a<T>(pa, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        mma_b<T>(o[dt], pa, Vt + dt * 8 * LDT + kc * 16, LDT, g, t);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int64_t i = row0 + g + 8 * h;
    if (i >= a.sq) continue;
    const float inv = l[h] > 0.f ? 1.0f / l[h] : 0.f;
    uint16_t* orow = out + (bh * a.sq + i) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      store2<T>(orow + dt * 8 + 2 * t, o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
    // kmath::softmax_lse of the natural-log state (m ln 2, l), as the reference writes it.
    if (t == 0) lse[bh * a.sq + i] = l[h] > 0.f ? m[h] * kLn2 + logf(l[h]) : -kmath::kInf;
  }
}

// dQ = scale * dS K over the key tiles, per block of 64 query rows (16 per warp), with
// P = exp(S - lse) and dS = P * (dO V^T - D).
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    bwd_dq_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                  const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                  const float* __restrict__ lse, const float* __restrict__ dvec,
                  uint16_t* __restrict__ dq, AttnArgs a) {
  constexpr int LD = D + kPad;       // Qs, dOs, Ks, Vs: [row][d]
  constexpr int LDT = kKeys + kPad;  // Kt: [d][key]
  extern __shared__ uint4 smem_vec[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_vec);  // [kRows][LD]
  uint16_t* dOs = Qs + kRows * LD;                       // [kRows][LD]
  uint16_t* Ks = dOs + kRows * LD;                       // [kKeys][LD]
  uint16_t* Vs = Ks + kKeys * LD;                        // [kKeys][LD]
  uint16_t* Kt = Vs + kKeys * LD;                        // [D][LDT]
  const int64_t bh = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = q0 + warp * 16;
  const uint16_t* kh = k + bh * a.sk * D;
  const uint16_t* vh = v + bh * a.sk * D;
  load_rows<D, kRows>(Qs, LD, q + bh * a.sq * D, q0, a.sq);
  load_rows<D, kRows>(dOs, LD, dout + bh * a.sq * D, q0, a.sq);

  float L2[2], Dr[2];  // lse in log2 units and D of rows g, g + 8 (0 past sq: never stored)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t i = row0 + g + 8 * h;
    L2[h] = i < a.sq ? lse[bh * a.sq + i] * kLog2e : 0.f;
    Dr[h] = i < a.sq ? dvec[bh * a.sq + i] : 0.f;
  }
  float acc[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  const float sl2 = a.scale * kLog2e;
  const uint16_t* Qw = Qs + warp * 16 * LD;
  const uint16_t* dOw = dOs + warp * 16 * LD;
  const int64_t q_last = (q0 + kRows < a.sq ? q0 + kRows : a.sq) - 1;
  const int64_t k_end = a.causal ? attn_causal_key_end(a, q_last) : a.sk;
  for (int64_t k0 = 0; k0 < k_end; k0 += kKeys) {
    __syncthreads();
    load_rows<D, kKeys>(Ks, LD, kh, k0, a.sk);
    load_rows<D, kKeys>(Vs, LD, vh, k0, a.sk);
    load_rows_t<D, kKeys>(Kt, LDT, kh, k0, a.sk);
    __syncthreads();
    float s[kKeys / 8][4], dp[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], ga[4];
      load_a(qa, Qw + kk * 16, LD, g, t);
      load_a(ga, dOw + kk * 16, LD, g, t);
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        mma_b<T>(s[nt], qa, Ks + nt * 8 * LD + kk * 16, LD, g, t);
        mma_b<T>(dp[nt], ga, Vs + nt * 8 * LD + kk * 16, LD, g, t);
      }
    }
    // s becomes dS = P * (dP - D), zero where masked.
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int64_t j = k0 + nt * 8 + 2 * t + (e & 1);
        const int64_t i = row0 + g + 8 * h;
        const bool valid = attn_visible(a, bh, i, j);
        const float p = valid ? exp2f(s[nt][e] * sl2 - L2[h]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - Dr[h]);
      }
    }
#pragma unroll
    for (int kc = 0; kc < kKeys / 16; ++kc) {
      uint32_t da[4];
      c_to_a<T>(da, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        mma_b<T>(acc[dt], da, Kt + dt * 8 * LDT + kc * 16, LDT, g, t);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t i = row0 + g + 8 * h;
    if (i >= a.sq) continue;
    uint16_t* row = dq + (bh * a.sq + i) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      store2<T>(row + dt * 8 + 2 * t, a.scale * acc[dt][2 * h], a.scale * acc[dt][2 * h + 1]);
    }
  }
}

// dV = P^T dO and dK = scale * dS^T Q over the query tiles, per block of 64 keys (16 per warp).
// Scores are computed transposed (S^T = K Q^T: keys are the rows) so each warp's P^T and dS^T
// tiles feed its own dK / dV products straight from registers.
template <class T, int D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    bwd_dkdv_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                    const uint16_t* __restrict__ v, const uint16_t* __restrict__ dout,
                    const float* __restrict__ lse, const float* __restrict__ dvec,
                    uint16_t* __restrict__ dk, uint16_t* __restrict__ dv, AttnArgs a) {
  constexpr int LD = D + kPad;        // Ks, Vs, Qs, dOs: [row][d]
  constexpr int LDT = kQTile + kPad;  // Qt, dOt: [d][query]
  extern __shared__ uint4 smem_vec[];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem_vec);  // [kKeys][LD]
  uint16_t* Vs = Ks + kKeys * LD;                        // [kKeys][LD]
  uint16_t* Qs = Vs + kKeys * LD;                        // [kQTile][LD]
  uint16_t* dOs = Qs + kQTile * LD;                      // [kQTile][LD]
  uint16_t* Qt = dOs + kQTile * LD;                      // [D][LDT]
  uint16_t* dOt = Qt + D * LDT;                          // [D][LDT]
  float* Ls = reinterpret_cast<float*>(dOt + D * LDT);   // [kQTile], log2 units
  float* Ds = Ls + kQTile;                               // [kQTile]
  const int64_t bh = blockIdx.y;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKeys;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t key0 = k0 + warp * 16;  // this warp's first key
  const uint16_t* qh = q + bh * a.sq * D;
  const uint16_t* gh = dout + bh * a.sq * D;
  load_rows<D, kKeys>(Ks, LD, k + bh * a.sk * D, k0, a.sk);
  load_rows<D, kKeys>(Vs, LD, v + bh * a.sk * D, k0, a.sk);
  const uint16_t* Kw = Ks + warp * 16 * LD;
  const uint16_t* Vw = Vs + warp * 16 * LD;

  float gk[D / 8][4], gv[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) gk[dt][e] = gv[dt][e] = 0.f;
  }
  const float sl2 = a.scale * kLog2e;
  // Causal: query rows before k0 - delta see none of this block's keys.
  const int64_t q_first = a.causal && k0 - a.delta > 0 ? k0 - a.delta : 0;
  const int64_t q_begin = (q_first / kQTile) * kQTile;
  for (int64_t qc = q_begin; qc < a.sq; qc += kQTile) {
    __syncthreads();
    load_rows<D, kQTile>(Qs, LD, qh, qc, a.sq);
    load_rows<D, kQTile>(dOs, LD, gh, qc, a.sq);
    load_rows_t<D, kQTile>(Qt, LDT, qh, qc, a.sq);
    load_rows_t<D, kQTile>(dOt, LDT, gh, qc, a.sq);
    if (threadIdx.x < kQTile) {
      const int64_t i = qc + threadIdx.x;
      Ls[threadIdx.x] = i < a.sq ? lse[bh * a.sq + i] * kLog2e : 0.f;
      Ds[threadIdx.x] = i < a.sq ? dvec[bh * a.sq + i] : 0.f;
    }
    __syncthreads();
    // S^T and dP^T = V dO^T: 16 keys x kQTile queries.
    float s[kQTile / 8][4], dp[kQTile / 8][4];
#pragma unroll
    for (int nt = 0; nt < kQTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      load_a(ka, Kw + kk * 16, LD, g, t);
      load_a(va, Vw + kk * 16, LD, g, t);
#pragma unroll
      for (int nt = 0; nt < kQTile / 8; ++nt) {
        mma_b<T>(s[nt], ka, Qs + nt * 8 * LD + kk * 16, LD, g, t);
        mma_b<T>(dp[nt], va, dOs + nt * 8 * LD + kk * 16, LD, g, t);
      }
    }
    // s becomes P^T and dp becomes dS^T = P^T * (dP^T - D), zero where masked. Element e of
    // tile nt: key key0 + g + 8 (e / 2), query qc + 8 nt + 2t + e % 2.
#pragma unroll
    for (int nt = 0; nt < kQTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * t + (e & 1);
        const int64_t i = qc + c;
        const int64_t j = key0 + g + 8 * (e >> 1);
        const bool valid = attn_visible(a, bh, i, j);
        const float p = valid ? exp2f(s[nt][e] * sl2 - Ls[c]) : 0.f;
        s[nt][e] = p;
        dp[nt][e] = p * (dp[nt][e] - Ds[c]);
      }
    }
    // dV += P^T dO, dK += dS^T Q: k = the tile's queries, B from the transposed tiles.
#pragma unroll
    for (int kc = 0; kc < kQTile / 16; ++kc) {
      uint32_t pa[4], da[4];
      c_to_a<T>(pa, s[2 * kc], s[2 * kc + 1]);
      c_to_a<T>(da, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        mma_b<T>(gv[dt], pa, dOt + dt * 8 * LDT + kc * 16, LDT, g, t);
        mma_b<T>(gk[dt], da, Qt + dt * 8 * LDT + kc * 16, LDT, g, t);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t j = key0 + g + 8 * h;
    if (j >= a.sk) continue;
    uint16_t* krow = dk + (bh * a.sk + j) * D;
    uint16_t* vrow = dv + (bh * a.sk + j) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      store2<T>(krow + dt * 8 + 2 * t, a.scale * gk[dt][2 * h], a.scale * gk[dt][2 * h + 1]);
      store2<T>(vrow + dt * 8 + 2 * t, gv[dt][2 * h], gv[dt][2 * h + 1]);
    }
  }
}

// Shared-memory bytes of each kernel for head_dim D.
constexpr size_t fwd_smem(int D) {
  return (size_t{2} * kRows * (D + kPad) + size_t{1} * D * (kKeys + kPad)) * 2;
}
constexpr size_t dq_smem(int D) {
  return (size_t{4} * kRows * (D + kPad) + size_t{1} * D * (kKeys + kPad)) * 2;
}
constexpr size_t dkdv_smem(int D) {
  return (size_t{2} * (kKeys + kQTile) * (D + kPad) + size_t{2} * D * (kQTile + kPad)) * 2 +
         size_t{2} * kQTile * sizeof(float);
}
static_assert(kRows == kKeys, "fwd_smem / dq_smem size the query and key tiles alike");

inline const uint16_t* bits(const void* p) { return static_cast<const uint16_t*>(p); }
inline uint16_t* bits(void* p) { return static_cast<uint16_t*>(p); }

// Calls f(std::integral_constant<int, D>) for the supported head dims.
template <class F>
void dispatch_d(int d, F&& f) {
  if (d == 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    MESHRT_CHECK(d == 128, "flash attention: head_dim " << d << " is not 64 or 128");
    f(std::integral_constant<int, 128>{});
  }
}

}  // namespace flash

template <class T>
void flash_attention_fwd(const AttnArgs& a, const T* q, const T* k, const T* v, T* out, float* lse,
                         cudaStream_t st) {
  using namespace flash;
  dispatch_d(a.d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    auto kernel = fwd_kernel<T, D>;
    set_smem(kernel, fwd_smem(D));
    kernel<<<dim3(attn_tiles(a.sq, kRows), static_cast<unsigned>(a.bh)), kThreadsPerBlock,
             fwd_smem(D), st>>>(bits(q), bits(k), bits(v), bits(out), lse, a);
  });
  MESHRT_CUDA_CHECK_LAUNCH("flash_attention_fwd<" << attn_dtype_name<T>() << ", d=" << a.d << ">");
}

template <class T>
void flash_attention_bwd(const AttnArgs& a, const T* q, const T* k, const T* v, const T* dout,
                         const float* lse, const float* dvec, T* dq, T* dk, T* dv,
                         cudaStream_t st) {
  using namespace flash;
  dispatch_d(a.d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    auto kq = bwd_dq_kernel<T, D>;
    set_smem(kq, dq_smem(D));
    kq<<<dim3(attn_tiles(a.sq, kRows), static_cast<unsigned>(a.bh)), kThreadsPerBlock, dq_smem(D),
         st>>>(bits(q), bits(k), bits(v), bits(dout), lse, dvec, bits(dq), a);
    MESHRT_CUDA_CHECK_LAUNCH("flash_attention_bwd_dq<" << attn_dtype_name<T>() << ", d=" << a.d
                                                       << ">");
    if (a.sk == 0) return;
    auto kkv = bwd_dkdv_kernel<T, D>;
    set_smem(kkv, dkdv_smem(D));
    kkv<<<dim3(attn_tiles(a.sk, kKeys), static_cast<unsigned>(a.bh)), kThreadsPerBlock,
          dkdv_smem(D), st>>>(bits(q), bits(k), bits(v), bits(dout), lse, dvec, bits(dk), bits(dv),
                              a);
    MESHRT_CUDA_CHECK_LAUNCH("flash_attention_bwd_dkdv<" << attn_dtype_name<T>() << ", d=" << a.d
                                                         << ">");
  });
}

// Each flash_attention_<dtype>.cu instantiates the launchers for its dtype.
#define MESHRT_FLASH_ATTENTION(T)                                                                 \
  template void flash_attention_fwd<T>(const AttnArgs&, const T*, const T*, const T*, T*, float*, \
                                       cudaStream_t);                                             \
  template void flash_attention_bwd<T>(const AttnArgs&, const T*, const T*, const T*, const T*,   \
                                       const float*, const float*, T*, T*, T*, cudaStream_t)

}  // namespace meshrt::kernels::cuda
