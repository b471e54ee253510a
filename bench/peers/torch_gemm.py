#!/usr/bin/env python3
"""meshrt's host GEMM (`meshrt bench gemm --json`) against PyTorch's torch.matmul on the CPU, on
the per-rank GEMM shapes of the default block (hidden 1024, ffn 4096, seq 512, tp=2 with sequence
parallelism: 512 tokens per rank after the all-gather), in the same run.

Each repeat runs meshrt and then PyTorch (PyTorch first in even repeats) on one shape with the same
threads (`--threads`, default 1: what each of 2 ranks gets on 2 cores), so both see the same load;
it prints the medians over repeats and the median of the per-pair ratios (PyTorch time / meshrt
time, > 1: meshrt faster). `meshrt bench gemm` has no transposed-A flag, so the weight-gradient
GEMMs (A^T B) are not in the set; the forward (A B^T) and input-gradient (A B) ones are.

    .venv-torch/bin/python bench/peers/torch_gemm.py --meshrt build/bin/meshrt --dtype bf16
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

# (name, m, n, k, trans_b): the block's linear layers per rank, forward (x W^T) and dgrad (dy W).
SHAPES = [
    ("qkv fwd", 512, 1536, 1024, True),
    ("qkv dgrad", 512, 1024, 1536, False),
    ("proj fwd", 512, 1024, 512, True),
    ("proj dgrad", 512, 512, 1024, False),
    ("fc1 fwd", 512, 2048, 1024, True),
    ("fc1 dgrad", 512, 1024, 2048, False),
    ("fc2 fwd", 512, 1024, 2048, True),
    ("fc2 dgrad", 512, 2048, 1024, False),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--meshrt", default="build/bin/meshrt")
    p.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs", type=int, default=7, help="timed runs per measurement (median)")
    p.add_argument("--json", default=None)
    return p.parse_args()


def meshrt_gflops(a, m, n, k, tb):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [a.meshrt, "bench", "gemm", "--devices", "cpu", "--dtype", a.dtype, "-m", str(m),
               "-n", str(n), "-k", str(k), "--no-elementwise", "--no-attention", "--repeats",
               str(a.runs), "--json", f.name] + (["--trans-b"] if tb else [])
        env = dict(os.environ, MESHRT_HOST_THREADS=str(a.threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))["gemm"][0]["meshrt_gflops"]


def torch_gflops(torch, a, m, n, k, tb):
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    x = torch.rand(m, k, dtype=dt) - 0.5
    w = (torch.rand(n, k, dtype=dt) - 0.5).t() if tb else torch.rand(k, n, dtype=dt) - 0.5
    torch.matmul(x, w)
    ts = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        torch.matmul(x, w)
        ts.append(time.perf_counter() - t0)
    return 2.0 * m * n * k / statistics.median(ts) / 1e9


def main():
    a = parse_args()
    import torch
    torch.set_num_threads(a.threads)
    print(f"host GEMM side by side: {a.dtype}, {a.threads} thread(s) each, {a.repeats} pairs per "
          f"shape (order alternating), median of {a.runs} runs per measurement; "
          f"torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print(f"  {'shape':11s} {'m':>5s} {'n':>5s} {'k':>5s} tb  meshrt GF/s  torch GF/s  "
          f"paired ratio (pairs)")
    rows = []
    tot_m = tot_t = 0.0
    for name, m, n, k, tb in SHAPES:
        pairs = []
        for r in range(a.repeats):
            if r % 2 == 0:
                g_m = meshrt_gflops(a, m, n, k, tb)
                g_t = torch_gflops(torch, a, m, n, k, tb)
            else:
                g_t = torch_gflops(torch, a, m, n, k, tb)
                g_m = meshrt_gflops(a, m, n, k, tb)
            pairs.append((g_m, g_t))
        gm = statistics.median(p[0] for p in pairs)
        gt = statistics.median(p[1] for p in pairs)
        ratios = [p[0] / p[1] for p in pairs]
        fl = 2.0 * m * n * k / 1e9
        tot_m += fl / gm
        tot_t += fl / gt
        print(f"  {name:11s} {m:5d} {n:5d} {k:5d} {'T' if tb else 'N'}   {gm:11.1f} {gt:11.1f}  "
              f"{statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)")
        rows.append({"shape": name, "m": m, "n": n, "k": k, "trans_b": tb, "meshrt_gflops": gm,
                     "torch_gflops": gt, "paired_ratio": statistics.median(ratios),
                     "pairs": pairs})
    print(f"  all shapes: torch time / meshrt time (sum of medians) {tot_t / tot_m:.2f}x; "
          f"load {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"dtype": a.dtype, "threads": a.threads, "torch": torch.__version__,
                       "rows": rows, "ratio_of_sums": tot_t / tot_m}, f, indent=1)


if __name__ == "__main__":
    main()
