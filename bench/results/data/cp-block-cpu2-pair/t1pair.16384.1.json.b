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
  "command_line": "meshrt bench block --devices cpu:1 --mesh tp=1 --seq 16384 --hidden 128 --heads 2 --layers 1 --batch 1 --steps 3 --warmup 1 --no-calibrate --json /tmp/cpp/t1pair.16384.1.json.b",
  "compute_ms_median": 4011.426778,
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
    "seq": 16384,
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
      "attention": 68719476736.0,
      "attention_unmasked": 137438953472.0,
      "mlp": 4294967296.0,
      "out_proj": 536870912.0,
      "qkv": 1610612736.0,
      "total": 75161927680.0
    },
    "per_step": 225485783040.0
  },
  "host_f32_gemm": {
    "choices": [
      {
        "forced": false,
        "k": 128,
        "m": 16384,
        "n": 384,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 16384,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 16384,
        "n": 512,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 512,
        "m": 16384,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 16384,
        "n": 512,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 16384,
        "m": 512,
        "n": 128,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 512,
        "m": 16384,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 16384,
        "m": 128,
        "n": 512,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 128,
        "m": 16384,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 16384,
        "m": 128,
        "n": 128,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 384,
        "m": 16384,
        "n": 128,
        "path": "onednn",
        "trans_a": false,
        "trans_b": true
      },
      {
        "forced": false,
        "k": 16384,
        "m": 128,
        "n": 384,
        "path": "onednn",
        "trans_a": true,
        "trans_b": false
      },
      {
        "forced": false,
        "k": 16384,
        "m": 1,
        "n": 384,
        "path": "onednn",
        "trans_a": false,
        "trans_b": false
      }
    ],
    "mode": "auto: OpenBLAS (OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64) or f32 matmul of oneDNN 3.2.0 (CPU ISA avx512_core_bf16), by a fixed table: oneDNN for tiles of at least 4194304 multiply-adds (AVX-512), OpenBLAS for smaller ones (MESHRT_HOST_F32_GEMM=openblas|onednn forces one)"
  },
  "memory": {
    "host_stream_reuse": true,
    "launch_blocking": false,
    "note": "allocator peak over the timed steps (parameters, gradients, activations, communication buffers)",
    "peak_allocated_bytes_max": 203495936
  },
  "mfu": null,
  "overhead": {
    "definition": "CPU time of the issuing thread per step (mesh layer, scheduler, allocator, enqueueing, benchmark timers and trace markers), slowest rank; target <= 3% of the step",
    "fraction_of_step": 3.625019426940665e-05,
    "issue_cpu_ms_median": 0.145415,
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
      "compute_ms": 4523.457359772718,
      "cp_bytes_per_step_per_rank": 0.0,
      "cp_collectives_per_step_per_rank": 0,
      "cp_comm_ms": 0.0,
      "cp_exposed_ms": 0.0,
      "dp_bytes_per_step_per_rank": 0.0,
      "dp_collectives_per_step_per_rank": 0,
      "dp_comm_ms": 0.0,
      "dp_exposed_ms": 0.0,
      "memory_bytes": 203430400.0,
      "step_ms": 4523.457359772718,
      "tp_bytes_per_step_per_rank": 0.0,
      "tp_collectives_per_step_per_rank": 0,
      "tp_comm_ms": 0.0,
      "tp_exposed_ms": 0.0
    },
    "step_error": 0.12764300836322473
  },
  "ranks": [
    {
      "calibration_gflops": 0.0,
      "compute_ms_median": 4011.426778,
      "device_index": 0,
      "dp_exposed_ms_median": 0.0,
      "peak_allocated_bytes": 203495936,
      "rank": 0,
      "reserved_bytes": 254555136,
      "step_ms_median": 4011.426778,
      "tp_exposed_ms_median": 0.0
    }
  ],
  "skew": {
    "compute_ms_fastest": 4011.426778,
    "compute_ms_slowest": 4011.426778,
    "compute_skew_fraction": 0.0,
    "fastest_rank": 0,
    "slowest_rank": 0,
    "step_ms_fastest": 4011.426778,
    "step_ms_slowest": 4011.426778,
    "step_skew_fraction": 0.0
  },
  "step_ms": {
    "all": [
      4011.426778,
      4654.974252,
      3353.988268
    ],
    "definition": "per step, the slowest rank's wall time from a barrier to its streams drained",
    "max": 4654.974252,
    "median": 4011.426778,
    "min": 3353.988268,
    "p10": 3485.47597,
    "p90": 4526.2647572
  },
  "tflops_model": 0.05621086848116962,
  "tflops_per_rank": 0.05621086848116962,
  "tokens_per_s": 4084.3323103528433,
  "tokens_per_step": 16384.0,
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
  "wall_s": 16.186556997
}
