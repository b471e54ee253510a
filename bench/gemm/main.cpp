// meshrt-bench-gemm: GEMM / elementwise / attention microbenchmark of the kernels layer.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "bench/gemm/gemm_bench.h"

int main(int argc, char** argv) {
  meshrt::GemmBenchOptions o;
  CLI::App app{
      "Kernel microbenchmark: meshrt GEMM vs raw BLAS (host) or cuBLAS (CUDA), elementwise GB/s "
      "vs a memcpy of the same bytes, fused causal attention."};
  app.add_option("-m", o.m, "GEMM rows of A and C (with -n and -k: one shape instead of the set)");
  app.add_option("-n", o.n, "GEMM columns of B and C");
  app.add_option("-k", o.k, "GEMM inner dimension");
  app.add_flag("--trans-b", o.trans_b, "B stored as [n, k]");
  app.add_option("--dtype", o.dtype, "f32 | bf16 | f16")->capture_default_str();
  app.add_option("--devices", o.devices, "cpu | cpu:N (N ranks as threads) | cuda:N")
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed runs per measurement")->capture_default_str();
  app.add_option("--repeats", o.repeats, "timed runs (median reported)")->capture_default_str();
  app.add_option("--tokens", o.tokens,
                 "rows of the block shapes and elementwise tensors "
                 "(0: 2048 on cpu, 8192 on cuda)");
  app.add_option("--hidden", o.hidden, "hidden size (0: 768 on cpu, 4096 on cuda)");
  bool no_gemm = false, no_elem = false, no_attn = false;
  app.add_flag("--no-gemm", no_gemm, "skip the GEMM table");
  app.add_flag("--no-elementwise", no_elem, "skip the elementwise table");
  app.add_flag("--no-attention", no_attn, "skip attention");
  app.add_option("--attn-batch", o.attn_batch, "attention batch (0: 1 on cpu, 4 on cuda)");
  app.add_option("--attn-heads", o.attn_heads, "attention heads (0: 8 on cpu, 16 on cuda)");
  app.add_option("--attn-seq", o.attn_seq, "attention sequence (0: 1024 on cpu, 2048 on cuda)");
  app.add_option("--attn-head-dim", o.attn_head_dim, "attention head dim")->capture_default_str();
  app.add_option("--json", o.json_path, "also write the figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  o.gemm = !no_gemm;
  o.elementwise = !no_elem;
  o.attention = !no_attn;
  try {
    return meshrt::run_gemm_bench(o, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "meshrt-bench-gemm: " << e.what() << "\n";
    return 2;
  }
}
