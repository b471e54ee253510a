// Host models of the CUDA attention kernels' numerics, and the float64 reference: the unit test
// test_attention_twin.cpp runs them on the [cuda] tests' own cases and proves, on every CI run
// without a GPU, that those tests' tolerances (attention_cases.h) hold with margin.
//
// The flash twin walks the keys in the flash kernels' 64-key tiles with their online softmax in
// the log2 domain (backends/cuda/kernels/flash_attention.cuh), in f32, and rounds to the 16-bit
// dtype exactly where they do: P before P V (forward) and P^T dO (dV), dS before dS K (dQ) and dS^T
// Q (dK), and every stored output; the row sum l and D = rowsum(dO * O) stay f32. The reference
// twin is the same f32 arithmetic with only the stored outputs rounded, as the CUDA reference
// kernel does. Both reproduce the kernels' errors statistically (the tensor cores' and the GPU
// exp2f's last f32 bits are not modelled), not bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "helpers.h"

namespace kt {

// One attention problem: bh heads of q [sq, d] against k / v [sk, d], contiguous, as values.
struct AttnProblem {
  int64_t bh = 1, sq = 0, sk = 0, d = 0;
  double scale = 1.0;
  bool causal = false;
};

// Which arithmetic runs: the flash twin, the reference twin (both round stored outputs to dt) or
// float64 with no rounding at all.
enum class AttnNumerics { Flash, Reference, Float64 };

struct AttnFwd {
  Vec out, lse;
};
struct AttnGrads {
  Vec dq, dk, dv;
};

// Rows to compute: empty means all of them (the others are left 0).
using RowSet = std::vector<int64_t>;

// Forward over query rows `rows` of every head: out [bh, sq, d] and lse [bh, sq].
AttnFwd attn_model_fwd(const AttnProblem& p, AttnNumerics num, DType dt, const Vec& q, const Vec& k,
                       const Vec& v, const RowSet& rows = {});

// Backward from the given out and lse (D = rowsum(dO * out), as the kernels' callers compute it):
// dq for query rows `q_rows`, dk / dv for keys `k_rows` of every head.
AttnGrads attn_model_bwd(const AttnProblem& p, AttnNumerics num, DType dt, const Vec& q,
                         const Vec& k, const Vec& v, const Vec& out, const Vec& dout,
                         const Vec& lse, const RowSet& q_rows = {}, const RowSet& k_rows = {});

// The elements of a [bh, n, row_len] tensor (row_len 1 for lse) in rows `rows` of every head, in
// order: what a sampled comparison checks.
Vec pick_rows(const Vec& x, int64_t bh, int64_t n, int64_t row_len, const RowSet& rows);

}  // namespace kt
