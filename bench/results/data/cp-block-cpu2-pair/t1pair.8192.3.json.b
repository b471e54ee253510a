{
  "comm": {
    "cp": {
      "bytes_per_step_per_rank": 0.0,
      "collectives_per_step_per_rank": 0.0,
      "comm_ms": [
        0.0,
        0.0,
        0.0
      ],
      "comm_ms_median": 0.0,
      "exposed_fraction": 0.0,
      "exposed_ms": [
        0.0,
        0.0,
        0.0
      ],
      "exposed_ms_median": 0.0,
      "size": 1
    },
    "dp": {
      "bytes_per_step_per_rank": 0.0,
      "collectives_per_step_per_rank": 0.0,
      "comm_ms": [
        0.0,
        0.0,
        0.0
      ],
      "comm_ms_median": 0.0,
      "exposed_fraction": 0.0,
      "exposed_ms": [
        0.0,
        0.0,
        0.0
      ],
      "exposed_ms_median": 0.0,
      "size": 1
    },
    "tp": {
      "bytes_per_step_per_rank": 0.0,
      "collectives_per_step_per_rank": 0.0,
      "comm_ms": [
        0.0,
        0.0,
        0.0
      ],
      "comm_ms_median": 0.0,
      "exposed_fraction": 0.0,
      "exposed_ms": [
        0.0,
        0.0,
        0.0
      ],
      "exposed_ms_median": 0.0,
      "size": 1
    }
  },
  "command_line": "meshrt bench block --devices cpu:1 --mesh tp=1 --seq 8192 --hidden 128 --heads 2 --layers 1 --batch 1 --steps 3 --warmup 1 --no-calibrate --json /tmp/cpp/t1pair.8192.3.json.b",
  "compute_ms_median": 2106.848737,
  "config": {
    "batch_per_replica": 1,
    "bucket_mb": 25.0,
    "cp": 1,
    "cp_comm": "ring",
    "deterministic": false,
    "deterministic_grain": 1,
    "device_type": "cpu",
    "devices": "cpu:1",
    "dp": 1,
    "dtype": "f32",
    "ffn": 512,
    "fwd_only": false,
    "global_batch": 1,
    "gpu_name": "",
    "heads": 2,
    "hidden": 128,
    "host_threads_per_rank": 2,
    "kind": "block",
    "launch": "1 rank as threads of this process, host backend",
    "layers": 1,
    "mesh": "tp=1",
    "overlap": "async",
    "seed": 1,
    "seq": 8192,
    "sp": false,
    "steps": 3,
    "tp": 1,
    "warmup": 1,
    "world_size": 1,
    "zero": 0
  },
  "flops": {
    "backward_factor": 2,
    "causal_attention": "counted at half (2*B*s^2*h per layer): meshrt's fused attention skips key tiles above the diagonal",
    "convention": "matmul FLOPs only (2 per multiply-add); B = global batch; backward = 2 x forward",
    "per_layer_forward": {
      "attention": 17179869184.0,
      "attention_unmasked": 34359738368.0,
      "mlp": 2147483648.0,
      "out_proj": 268435456.0,
      "qkv": 805306368.0,
      "total": 20401094656.0
    },
    "per_step": 61203283968.0
  },
  "host_f32_gemm": {
    "choices": [
      {
        "forced": false,
        "k": 128,
        "m": 8192,
        "n": 384,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 8192,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 8192,
        "n": 512,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 512,
        "m": 8192,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 8192,
        "n": 512,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 8192,
        "m": 512,
        "n": 128,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 512,
        "m": 8192,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 8192,
        "m": 128,
        "n": 512,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 8192,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 8192,
        "m": 128,
        "n": 128,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 384,
        "m": 8192,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 8192,
        "m": 128,
        "n": 384,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      }
    ],
    "mode": "auto: OpenBLAS (OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64) or f32 matmul of oneDNN 3.2.0 (CPU ISA avx512_core_bf16), by a fixed table: oneDNN for tiles of at least 4194304 multiply-adds (AVX-512), OpenBLAS for smaller ones (MESHRT_HOST_F32_GEMM=openblas|onednn forces one)"
  },
  "memory": {
    "host_stream_reuse": true,
    "launch_blocking": false,
    "note": "allocator peak over the timed steps (parameters, gradients, activations, communication buffers)",
    "peak_allocated_bytes_max": 102603264
  },
  "mfu": null,
  "overhead": {
    "definition": "CPU time of the issuing thread per step (mesh layer, scheduler, allocator, enqueueing, benchmark timers and trace markers), slowest rank; target <= 3% of the step",
    "fraction_of_step": 8.000099724292643e-05,
    "issue_cpu_ms_median": 0.16855,
    "trace_markers_per_step": 0.0
  },
  "peak": {
    "label": "",
    "source": "none",
    "tflops_per_rank": 0.0
  },
  "plan": {
    "cluster": "preset cpu, GEMM peak 160.0 GFLOP/s",
    "predicted": {
      "compute_ms": 1190.6162472201438,
      "cp_bytes_per_step_per_rank": 0.0,
      "cp_collectives_per_step_per_rank": 0,
      "cp_comm_ms": 0.0,
      "cp_exposed_ms": 0.0,
      "dp_bytes_per_step_per_rank": 0.0,
      "dp_collectives_per_step_per_rank": 0,
      "dp_comm_ms": 0.0,
      "dp_exposed_ms": 0.0,
      "memory_bytes": 102570496.0,
      "step_ms": 1190.6162472201438,
      "tp_bytes_per_step_per_rank": 0.0,
      "tp_collectives_per_step_per_rank": 0,
      "tp_comm_ms": 0.0,
      "tp_exposed_ms": 0.0
    },
    "step_error": -0.43488290055626144
  },
  "ranks": [
    {
      "calibration_gflops": 0.0,
      "compute_ms_median": 2106.848737,
      "device_index": 0,
      "dp_exposed_ms_median": 0.0,
      "peak_allocated_bytes": 102603264,
      "rank": 0,
      "reserved_bytes": 128496640,
      "step_ms_median": 2106.848737,
      "tp_exposed_ms_median": 0.0
    }
  ],
  "skew": {
    "compute_ms_fastest": 2106.848737,
    "compute_ms_slowest": 2106.848737,
    "compute_skew_fraction": 0.0,
    "fastest_rank": 0,
    "slowest_rank": 0,
    "step_ms_fastest": 2106.848737,
    "step_ms_slowest": 2106.848737,
    "step_skew_fraction": 0.0
  },
  "step_ms": {
    "all": [
      2106.848737,
      1549.860729,
      2398.027287
    ],
    "definition": "per step, the slowest rank's wall time from a barrier to its streams drained",
    "max": 2398.027287,
    "median": 2106.848737,
    "min": 1549.860729,
    "p10": 1661.2583306,
    "p90": 2339.791577
  },
  "tflops_model": 0.029049681115289296,
  "tflops_per_rank": 0.029049681115289296,
  "tokens_per_s": 3888.2715479920093,
  "tokens_per_step": 8192.0,
  "tool": "meshrt bench block",
  "versions": {
    "blas": "OpenBLAS (OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64)",
    "blas_threading": "pthreads, 2 threads by default",
    "build_type": "RelWithDebInfo",
    "compiler": "GNU 12.2.0",
    "cublaslt": "cuBLASLt 13.1.0",
    "cuda": "CUDA runtime 13.0, no CUDA driver; no usable GPU: cudaGetDeviceCount failed: cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime version); no NVIDIA driver was found (libcuda is not installed or not loadable)",
    "cuda_build": "ON (arch 90)",
    "cuda_unavailable": "cudaGetDeviceCount failed: cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime version); no NVIDIA driver was found (libcuda is not installed or not loadable)",
    "hardware_threads": "2",
    "host_gemm_16bit": "bf16: bf16 matmul of oneDNN 3.2.0 (CPU ISA avx512_core_bf16), f32 accumulation; f16: f32 sgemm on converted panels: oneDNN 3.2.0 (CPU ISA avx512_core_bf16) has no f16 matmul kernels here",
    "host_gemm_f32": "auto: OpenBLAS (OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64) or f32 matmul of oneDNN 3.2.0 (CPU ISA avx512_core_bf16), by a fixed table: oneDNN for tiles of at least 4194304 multiply-adds (AVX-512), OpenBLAS for smaller ones (MESHRT_HOST_F32_GEMM=openblas|onednn forces one)",
    "host_isa": "avx512 (built: baseline, avx2, avx512; this CPU runs up to avx512)",
    "meshrt": "0.2.0",
    "mpi": "Open MPI v4.1.4",
    "nccl": "2.28.9",
    "sanitize": "none"
  },
  "wall_s": 8.838514831000001
}
