#!/usr/bin/env python3
"""The meshrt block benchmark's block, run with PyTorch 2.x DTensor tensor parallelism, side by side
with `meshrt bench block` in the same run.

The block is the one `meshrt bench block|mlp|attn` runs: LayerNorm -> fused QKV (ColwiseParallel,
heads split over tp) -> causal attention on the local heads -> out-proj (RowwiseParallel) ->
residual, then LayerNorm -> fc1 (ColwiseParallel) -> GeLU (tanh) -> fc2 (RowwiseParallel) ->
residual; with --sp the norms and residuals run on sequence shards (SequenceParallel) and the
colwise inputs are all-gathered / rowwise outputs reduce-scattered along the sequence. One process
per rank on the CPU with the gloo backend (torch.distributed.tensor.parallel.parallelize_module over
a 1-D DeviceMesh), each process with cores / ranks intra-op threads, as meshrt gives its ranks.

Each repeat runs meshrt (build/bin/meshrt bench ... --json) and PyTorch back to back with the same
shapes, dtype, warm-up and steps, so both see the same machine load (meshrt first in odd repeats);
it prints the ratio of the medians over repeats and the median of the per-pair ratios.

PyTorch is only needed here (meshrt's tests do not use it):
    python3 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy
    .venv-torch/bin/python bench/peers/torch_tp_block.py --meshrt build-release/bin/meshrt
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", default="block", choices=["block", "mlp", "attn"])
    p.add_argument("--ranks", type=int, default=2, help="ranks (processes for PyTorch, "
                   "threads for meshrt: --devices cpu:N)")
    p.add_argument("--dp", type=int, default=1,
                   help="data-parallel replicas (tp = ranks / dp); PyTorch wraps the block in "
                   "DistributedDataParallel over the dp dim of a 2-D DeviceMesh")
    p.add_argument("--sweep", action="store_true",
                   help="every dp x tp factorisation of --ranks, sp off and on, x --batches, as "
                   "`meshrt sweep` runs them; a table of both step times and their ratio")
    p.add_argument("--batches", default="1,2,4", help="micro-batches per replica for --sweep")
    sp = p.add_mutually_exclusive_group()
    sp.add_argument("--sp", dest="sp", action="store_true", default=None,
                    help="sequence parallel (default: on when ranks > 1)")
    sp.add_argument("--no-sp", dest="sp", action="store_false")
    p.add_argument("--batch", type=int, default=1, help="micro-batch per dp replica")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=0, help="default 4 x hidden")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--f32-matmul-precision", default="highest", choices=["highest", "medium"],
                   help="f32 GEMM arithmetic of both: highest (f32, the default of both) or medium "
                        "(bf16 products where the CPU has them: PyTorch's "
                        "torch.set_float32_matmul_precision('medium'), meshrt's "
                        "MESHRT_HOST_F32_GEMM=bf16)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--fwd-only", action="store_true")
    p.add_argument("--repeats", type=int, default=3,
                   help="back-to-back meshrt / PyTorch pairs, meshrt first in odd ones (an even "
                   "count balances the order); medians and the median paired ratio are reported")
    p.add_argument("--meshrt", default=None,
                   help="meshrt binary (default: build-release/bin/meshrt, else build/bin/meshrt)")
    p.add_argument("--meshrt-args", default="", help="extra flags for meshrt bench")
    p.add_argument("--no-meshrt", action="store_true", help="PyTorch only")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per PyTorch rank (default cores / ranks)")
    p.add_argument("--json", default=None, help="write both sets of figures here")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (default: a free one)")
    a = p.parse_args()
    if a.ffn == 0:
        a.ffn = 4 * a.hidden
    for name in ("ranks", "dp", "batch", "seq", "hidden", "heads", "ffn", "layers", "steps",
                 "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.ranks % a.dp:
        p.error(f"--dp {a.dp} does not divide --ranks {a.ranks}")
    a.tp = a.ranks // a.dp
    if a.sp is None:
        a.sp = a.tp > 1
    try:
        a.batch_list = [int(b) for b in a.batches.split(",")]
        assert all(b >= 1 for b in a.batch_list)
    except (ValueError, AssertionError):
        p.error(f"--batches {a.batches}: give sizes like 1,2,4")
    if a.hidden % a.heads:
        p.error("hidden must divide by heads")
    return a


def check_shapes(a):
    """Why this configuration cannot run, or None."""
    if a.heads % a.tp or a.ffn % a.tp or a.hidden % a.tp:
        return f"heads, hidden and ffn must divide by tp={a.tp}"
    if a.sp and a.tp > 1 and a.seq % a.tp:
        return f"seq must divide by tp={a.tp} under sequence parallel"
    return None


def layer_flops(a):
    """Per-layer forward model FLOPs for the global batch (same counts as meshrt)."""
    B, s, h, f = a.batch * a.dp, a.seq, a.hidden, a.ffn
    fl = 0.0
    if a.kind != "mlp":
        fl += 6 * B * s * h * h + 4 * B * s * s * h / 2 + 2 * B * s * h * h  # causal: half
    if a.kind != "attn":
        fl += 4 * B * s * h * f
    return fl


def step_flops(a):
    return layer_flops(a) * a.layers * (1 if a.fwd_only else 3)


def pct(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


# ---- PyTorch side ------------------------------------------------------------------------------

def build_torch_model(a, mesh2, dt, sp):
    """The block stack as PyTorch layers, tensor-parallel over mesh2["tp"] (sequence-parallel
    norms with sp), wrapped in DDP over mesh2["dp"] when dp > 1."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp = a.tp
    hl, d = a.heads // tp, a.hidden // a.heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(a.hidden, eps=1e-5)
            self.qkv = nn.Linear(a.hidden, 3 * a.hidden)
            self.proj = nn.Linear(a.hidden, a.hidden)

        def forward(self, x):
            y = self.qkv(self.norm(x))  # [B, S, hl * 3 * d] local heads (colwise)
            B, S = y.shape[0], y.shape[1]
            q, k, v = y.view(B, S, hl, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.proj(o.transpose(1, 2).reshape(B, S, hl * d))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(a.hidden, eps=1e-5)
            self.fc1 = nn.Linear(a.hidden, a.ffn)
            self.fc2 = nn.Linear(a.ffn, a.hidden)

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))

    def plan(prefix, colwise, rowwise):
        if not sp:
            return {f"{prefix}.{colwise}": ColwiseParallel(), f"{prefix}.{rowwise}": RowwiseParallel()}
        return {
            f"{prefix}.norm": SequenceParallel(use_local_output=True),
            f"{prefix}.{colwise}": ColwiseParallel(input_layouts=Shard(1)),
            f"{prefix}.{rowwise}": RowwiseParallel(output_layouts=Shard(1)),
        }

    layers = nn.ModuleList()
    tp_plan = {}
    for i in range(a.layers):
        mods = nn.ModuleDict()
        if a.kind != "mlp":
            mods["attn"] = Attention()
            tp_plan.update(plan(f"{i}.attn", "qkv", "proj"))
        if a.kind != "attn":
            mods["mlp"] = Mlp()
            tp_plan.update(plan(f"{i}.mlp", "fc1", "fc2"))
        layers.append(mods)
    torch.manual_seed(1)
    for p_ in layers.parameters():
        if p_.dim() == 2:
            nn.init.normal_(p_, 0.0, 0.02)
    layers = layers.to(dt)
    if tp > 1:
        parallelize_module(layers, mesh2["tp"], tp_plan)

    class Stack(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            for mods in self.inner:
                for m in mods.values():
                    x = m(x)
            return x

    if a.dp > 1:  # DDP needs one module whose forward runs the stack
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(Stack(layers), process_group=mesh2["dp"].get_group())
    return Stack(layers)


def time_torch_steps(a, model, x, dout):
    """Wall time (ms) of each timed step on this rank, from a barrier to its backward's end."""
    import torch
    import torch.distributed as dist

    times = []
    for step in range(a.warmup + a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        if a.fwd_only:
            with torch.no_grad():
                model(x)
        else:
            model.zero_grad(set_to_none=True)
            x.grad = None
            out = model(x)
            out.backward(dout)
        t1 = time.perf_counter()
        if step >= a.warmup:
            times.append((t1 - t0) * 1e3)
    return times


def torch_worker(rank, a, port, out_path):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    threads = a.threads or max(1, (os.cpu_count() or 1) // a.ranks)
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(a.f32_matmul_precision)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    mesh2 = init_device_mesh("cpu", (a.dp, a.tp), mesh_dim_names=("dp", "tp"))
    tp = a.tp
    dp_rank = mesh2.get_local_rank("dp")
    tp_rank = mesh2.get_local_rank("tp")
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    sp = a.sp and tp > 1
    model = build_torch_model(a, mesh2, dt, sp)

    s_loc = a.seq // tp if sp else a.seq
    g = torch.Generator().manual_seed(100 + 1000 * dp_rank + (tp_rank if sp else 0))
    x = torch.randn(a.batch, s_loc, a.hidden, generator=g).to(dt).requires_grad_(True)
    dout = torch.randn(a.batch, s_loc, a.hidden, generator=g).to(dt)
    times = time_torch_steps(a, model, x, dout)
    # A step is done when its slowest rank is (as meshrt reports it).
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"step_ms": tt.tolist(), "threads_per_rank": threads,
                       "torch": torch.__version__}, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(a):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "torch.json")
        try:
            mp.spawn(torch_worker, args=(a, a.port or free_port(), out), nprocs=a.ranks,
                     join=True)
        except mp.ProcessExitedException as e:
            # PyTorch 2.15's gloo teardown sometimes aborts a rank ("terminate called without
            # an active exception") after the timings were all-reduced and written: keep them.
            if not os.path.exists(out):
                raise
            print(f"  (a PyTorch rank exited abnormally after its timings were written: {e})",
                  file=sys.stderr)
        with open(out) as f:
            return json.load(f)


# ---- meshrt side -------------------------------------------------------------------------------

def find_meshrt(a):
    if a.meshrt:
        return a.meshrt
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for b in ("build-release", "build"):
        p = os.path.join(root, b, "bin", "meshrt")
        if os.access(p, os.X_OK):
            return p
    sys.exit("meshrt binary not found: build it (make bench) or pass --meshrt PATH")


def run_meshrt(a, binary):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "meshrt.json")
        cmd = [binary, "bench", a.kind, "--devices", f"cpu:{a.ranks}", "--mesh", f"dp={a.dp},tp={a.tp}",
               "--sp" if a.sp else "--no-sp", "--batch", str(a.batch), "--seq", str(a.seq),
               "--hidden", str(a.hidden), "--heads", str(a.heads), "--ffn", str(a.ffn),
               "--layers", str(a.layers), "--dtype", a.dtype, "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--json", js] + (["--fwd-only"] if a.fwd_only else [])
        cmd += a.meshrt_args.split()
        env = dict(os.environ)
        if a.f32_matmul_precision == "medium":
            env["MESHRT_HOST_F32_GEMM"] = "bf16"
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"meshrt failed ({' '.join(cmd)}):\n{r.stderr}")
        with open(js) as f:
            prefix = ["MESHRT_HOST_F32_GEMM=bf16"] if a.f32_matmul_precision == "medium" else []
            return json.load(f), " ".join(prefix + ["meshrt"] + cmd[1:-2])


def compare(a, binary, verbose=True):
    """Alternating meshrt / PyTorch runs of one configuration; medians over the repeats."""
    import torch
    m_runs, t_runs, m_cmd, m_last, threads = [], [], "", None, 0
    for rep in range(a.repeats):
        # A pair per repeat, run back to back; the order alternates (meshrt first in odd
        # repeats) so neither side always gets the warmer or the quieter slot.
        def run_m():
            nonlocal m_last, m_cmd
            m_last, m_cmd = run_meshrt(a, binary)
            m_runs.append(m_last["step_ms"]["median"])
        if binary and rep % 2 == 0:
            run_m()
        tj = run_torch(a)
        threads = tj["threads_per_rank"]
        t_runs.append(statistics.median(tj["step_ms"]))
        t_last = tj
        if binary and rep % 2 == 1:
            run_m()
        if verbose:
            line = f"  repeat {rep + 1}: pytorch {t_runs[-1]:.2f} ms"
            if binary:
                line += f", meshrt {m_runs[-1]:.2f} ms, ratio {t_runs[-1] / m_runs[-1]:.2f}x"
            print(line, flush=True)
    r = {"config": {k: v for k, v in vars(a).items() if k != "batch_list"},
         "flops_per_step": step_flops(a), "tokens_per_step": a.batch * a.dp * a.seq,
         "pytorch": {"version": torch.__version__, "step_ms_median_per_repeat": t_runs,
                     "step_ms_median": statistics.median(t_runs), "threads_per_rank": threads,
                     "last_run_step_ms": t_last["step_ms"]}}
    if binary:
        r["meshrt"] = {"step_ms_median_per_repeat": m_runs, "step_ms_median": statistics.median(m_runs),
                       "command": m_cmd, "last_run": m_last}
        r["ratio_pytorch_over_meshrt"] = r["pytorch"]["step_ms_median"] / r["meshrt"]["step_ms_median"]
        # Paired: the ratio within each back-to-back pair, then their median. Load on a shared
        # machine comes in periods longer than one pair, so pairing cancels most of it.
        paired = [t / m for t, m in zip(t_runs, m_runs)]
        r["paired_ratios"] = paired
        r["paired_ratio_median"] = statistics.median(paired)
    return r


def describe(a):
    return (f"{a.kind} x{a.layers}, hidden {a.hidden}, heads {a.heads}, ffn {a.ffn}, seq {a.seq}, "
            f"{a.dtype}, warmup {a.warmup}, steps {a.steps}, "
            f"f32 matmul precision {a.f32_matmul_precision}, "
            f"{'forward only' if a.fwd_only else 'forward + backward'}; {a.repeats} back-to-back "
            f"pair(s) of meshrt and PyTorch per configuration, order alternating")


def main_single(a, binary):
    import torch
    print(f"block bench side by side: {describe(a)}; batch {a.batch} per replica, "
          f"dp={a.dp},tp={a.tp} (sp {'on' if a.sp and a.tp > 1 else 'off'})")
    r = compare(a, binary)
    tokens, flops = r["tokens_per_step"], r["flops_per_step"]

    def row(name, med_ms, p10, p90):
        tps = tokens / (med_ms * 1e-3)
        tf = flops / (med_ms * 1e-3) / 1e12
        print(f"  {name:<34} {med_ms:9.2f} {p10:9.2f} {p90:9.2f} {tps:10.0f} {tf:9.3f}")

    print(f"\n  {'':<34} {'step ms':>9} {'p10':>9} {'p90':>9} {'tokens/s':>10} {'TFLOP/s':>9}")
    t = r["pytorch"]
    row(f"pytorch {torch.__version__} DTensor (gloo)", t["step_ms_median"],
        pct(t["last_run_step_ms"], 0.1), pct(t["last_run_step_ms"], 0.9))
    if binary:
        m = r["meshrt"]
        row("meshrt", m["step_ms_median"], m["last_run"]["step_ms"]["p10"],
            m["last_run"]["step_ms"]["p90"])
        ratio = r["ratio_pytorch_over_meshrt"]
        pr = r["paired_ratio_median"]
        print(f"\n  ratio (PyTorch step time / meshrt step time, medians of {a.repeats} repeats): "
              f"{ratio:.2f}x -> meshrt {'faster' if ratio > 1 else 'slower'} "
              f"(target: >= {'1.25' if a.dtype == 'bf16' else '1.4'}x)")
        print(f"  paired ratio (median over the {a.repeats} back-to-back pairs): {pr:.2f}x "
              f"(pairs {min(r['paired_ratios']):.2f}x-{max(r['paired_ratios']):.2f}x)")
        print(f"  p10/p90 are of the last repeat's steps; per-rank threads: pytorch "
              f"{t['threads_per_rank']}, meshrt {m['last_run']['config'].get('host_threads_per_rank')}")
        print(f"  meshrt command: {m['command']}")
    return r


def main_sweep(a, binary):
    import copy
    print(f"sweep side by side on {a.ranks} ranks: {describe(a)}")
    print("batch = micro-batch per dp replica; ms = median over repeats; ratio = PyTorch step "
          "time / meshrt step time, of the medians and (paired) the median of the per-pair "
          "ratios, with the lowest and highest pair\n")
    print(f"  {'mesh':<12} {'sp':<4} {'batch':>5} {'meshrt ms':>10} {'pytorch ms':>11} "
          f"{'ratio':>7} {'paired':>7}  {'pairs':<13}", flush=True)
    rows, skipped = [], []
    for dp in [d for d in range(a.ranks, 0, -1) if a.ranks % d == 0]:
        tp = a.ranks // dp
        for sp in ([False] if tp == 1 else [False, True]):
            for b in a.batch_list:
                c = copy.copy(a)
                c.dp, c.tp, c.sp, c.batch = dp, tp, sp, b
                label = f"dp={dp},tp={tp}"
                why = check_shapes(c)
                if why:
                    skipped.append((label, sp, b, why))
                    continue
                r = compare(c, binary, verbose=False)
                rows.append(r)
                m = r.get("meshrt", {}).get("step_ms_median", float("nan"))
                ratio = r.get("ratio_pytorch_over_meshrt", float("nan"))
                pr = r.get("paired_ratios", [float("nan")])
                print(f"  {label:<12} {('on' if sp else 'off') if tp > 1 else '-':<4} {b:>5} "
                      f"{m:10.2f} {r['pytorch']['step_ms_median']:11.2f} {ratio:6.2f}x "
                      f"{r.get('paired_ratio_median', float('nan')):6.2f}x  "
                      f"{min(pr):.2f}-{max(pr):.2f}x", flush=True)
    for label, sp, b, why in skipped:
        print(f"  skipped {label} sp={sp} batch {b}: {why}")
    if binary and rows:
        for key, what in (("ratio_pytorch_over_meshrt", "ratio of medians"),
                          ("paired_ratio_median", "paired ratio")):
            worst = min(rows, key=lambda r: r[key])
            c = worst["config"]
            print(f"\n  lowest {what} {worst[key]:.2f}x at dp={c['dp']},tp={c['tp']} sp={c['sp']} "
                  f"batch {c['batch']} "
                  f"({'meshrt never slower' if worst[key] >= 1 else 'meshrt slower there'})", end="")
        print()
    return {"sweep": rows, "skipped": [list(s) for s in skipped]}


def main():
    a = parse_args()
    try:
        import torch  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
    except ImportError as e:
        sys.exit(f"PyTorch is not installed ({e}). It comes from PyPI:\n"
                 "    python3 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy\n"
                 "    .venv-torch/bin/python bench/peers/torch_tp_block.py\n"
                 "(a CPU run needs no GPU; the CUDA wheels work on CPU too)")
    binary = None if a.no_meshrt else find_meshrt(a)
    if not a.sweep:
        why = check_shapes(a)
        if not why and a.f32_matmul_precision != "highest" and a.dtype != "f32":
            why = f"--f32-matmul-precision {a.f32_matmul_precision} is for --dtype f32"
        if why:
            sys.exit(f"torch_tp_block.py: {why}")
    result = main_sweep(a, binary) if a.sweep else main_single(a, binary)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
