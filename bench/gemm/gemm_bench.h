// GEMM / elementwise / attention microbenchmark of the kernels layer, as a library function for
// the meshrt CLI (`meshrt bench gemm`) and the meshrt-bench-gemm program.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace meshrt {

struct GemmBenchOptions {
  // One GEMM shape C[m, n] = A[m, k] B[k, n]; all zero: 1024^3 plus the shapes of a transformer
  // block (QKV, out-proj, fc1, fc2 for `tokens` x `hidden`).
  int64_t m = 0, n = 0, k = 0;
  bool trans_b = false;         // B given as [n, k] (weights stored out x in)
  std::string dtype = "f32";    // f32 | bf16 | f16: GEMM inputs and elementwise tensors
  std::string devices = "cpu";  // cpu (one rank, all cores) | cpu:N (N ranks as threads) | cuda:N
  int warmup = 2;               // untimed runs per measurement
  int repeats = 7;              // timed runs; the median is reported
  int64_t tokens = 0;           // block / elementwise rows; 0: 2048 on cpu, 8192 on cuda
  int64_t hidden = 0;           // block / elementwise width; 0: 768 on cpu, 4096 on cuda
  bool gemm = true;             // GEMM table
  bool elementwise = true;      // layernorm / gelu / add GB/s vs memcpy
  bool attention = true;        // fused causal attention fwd / bwd
  int64_t attn_batch = 0, attn_heads = 0, attn_seq = 0, attn_head_dim = 64;  // 0: per device
  std::string json_path;  // also write every figure here as JSON
};

// Checks the options (dtype, devices, CUDA when asked for, sizes, shape, warmup and repeats)
// before any output; throws meshrt::Error saying what to change. run_gemm_bench checks them too.
void check_gemm_options(const GemmBenchOptions& opts);

// Runs the benchmark and prints its tables to `out`: for the host, meshrt GEMM GFLOP/s next to
// raw cblas_sgemm on the same shapes ("vs blas 0.98x") and elementwise GB/s next to a memcpy of
// the same bytes; for CUDA, GEMM TFLOP/s next to a plain cublasGemmEx, kernel GB/s next to a
// device-to-device copy, attention TFLOP/s of both CUDA kernels (flash and reference). Medians of
// `repeats` runs. Returns 0; throws meshrt::Error on invalid options.
int run_gemm_bench(const GemmBenchOptions& opts, std::ostream& out);

}  // namespace meshrt
