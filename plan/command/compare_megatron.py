#!/usr/bin/env python3
"""Planner predictions against published Megatron-LM runs (docs/plan.md, "Planning a run").

Source: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21 (arXiv:2104.04473), Table 1: GPT models, vocabulary 51200, sequence 2048,
mixed precision, A100 80GB (Selene: 8 per node, 8x HDR 200 Gb/s InfiniBand per node), full
activation recomputation. The rows without pipeline parallelism (p = 1) are the dp x tp layouts
meshrt's planner covers. Their TFLOP/s per GPU counts the recomputed forward:
F = 96 B s l h^2 (1 + s / 6h + V / 16lh) per iteration, so the measured iteration time is
F / (GPUs x TFLOP/s).

Usage: compare_megatron.py path/to/meshrt
"""
import json
import os
import subprocess
import sys
import tempfile

# params (B), heads, hidden, layers, tp, GPUs, global batch, published TFLOP/s per GPU
ROWS = [
    (1.7, 24, 2304, 24, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 256, 1024, 135),
]
SEQ, VOCAB = 2048, 51200


def main():
    meshrt = sys.argv[1] if len(sys.argv) > 1 else "meshrt"
    print("| model | tp x dp (A100) | batch | published TFLOP/s/GPU | published s/iter | "
          "predicted s/iter (best micro-batch at that tp) | error | predicted TFLOP/s/GPU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for params, heads, h, layers, tp, gpus, batch, tflops in ROWS:
        flops = 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))
        t_pub = flops / (gpus * tflops * 1e12)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "plan.json")
            subprocess.run(
                [meshrt, "plan", "--model",
                 f"hidden={h},heads={heads},layers={layers},seq={SEQ},vocab={VOCAB}",
                 "--global-batch", str(batch), "--cluster", f"a100-sxm:8x{gpus // 8}",
                 "--dtype", "bf16", "--recompute", "--top", "1", "--json", out],
                check=True, stdout=subprocess.DEVNULL)
            plan = json.load(open(out))
        # Megatron (2021) ran without sequence or context parallelism, at the published tp.
        cands = [c for c in plan["configs"]
                 if c["tp"] == tp and c.get("cp", 1) == 1 and not c["sp"] and c["fits"]]
        if not cands:
            print(f"| {params}B | {tp} x {gpus // tp} | {batch} | {tflops} | {t_pub:.2f} | "
                  "does not fit | | |")
            continue
        best = max(cands, key=lambda c: c["tokens_per_s"])
        t_pred = best["step_ms"] / 1e3
        print(f"| {params}B (h {h}, {layers} layers) | {tp} x {gpus // tp} | {batch} | {tflops} | "
              f"{t_pub:.2f} | {t_pred:.2f} (mb {best['micro_batch']}) | "
              f"{100 * (t_pred / t_pub - 1):+.0f}% | {flops / gpus / t_pred / 1e12:.0f} |")


if __name__ == "__main__":
    main()
