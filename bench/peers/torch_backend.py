#!/usr/bin/env python3
"""torch.distributed collectives on CPU tensors, 2 processes, in one run: the "meshrt" backend
(import meshrt.torch) against gloo and DeepSpeed's shared-memory CPU all-reduce
(deepspeed.ops.op_builder.cpu.ShareMemCommBuilder's inference_all_reduce; skipped, saying why,
where deepspeed is missing or its op does not build). All-reduce, all-gather, reduce-scatter and
all-to-all from 8 B to 64 MiB (float32; the size is the largest buffer of the call: the
all-reduce tensor, the all-gather output, the reduce-scatter input, the all-to-all tensor).
Each cell is the median over rounds of the slower rank's time per call; within a round every
backend runs a batch of calls in turn, so they see the same load. Last, one DDP step (forward, backward, SGD) of the
tests/torch model on each backend.

    PYTHONPATH=build/python /opt/meshrt-deps/torch-venv/bin/python bench/peers/torch_backend.py

DeepSpeed from PyPI, beside torch (its op compiles on first use; it needs the `wheel` package):
    pip install --no-build-isolation --no-deps --target /tmp/ds-py deepspeed hjson ninja psutil \
      py-cpuinfo pydantic pydantic-core annotated-types typing-inspection msgpack einops tqdm \
      nvidia-ml-py
    PATH=/tmp/ds-py/bin:$PATH PYTHONPATH=build/python:/tmp/ds-py python bench/peers/torch_backend.py

starts itself under torchrun (2 processes; --nproc N for another count) unless it already runs
under it. --json FILE also writes the table as JSON. --ops all_reduce,... and --max-bytes N time
a part of the table (the DDP step then only with --ddp). docs/torch.md shows a run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 64 << 20]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def human(n):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def reps_for(nbytes):
    return max(9, min(450, (64 << 20) // max(nbytes, 1) // 8))


def deepspeed_allreduce():
    """DeepSpeed's shm all-reduce as fn(tensor), or (None, why)."""
    try:
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
    except Exception as e:  # noqa: BLE001
        return None, f"deepspeed is not importable ({type(e).__name__}: {e})"
    try:
        op = ShareMemCommBuilder().load()
        import torch.distributed as dist
        # The op takes its shm path only when every rank is local: LOCAL_SIZE says so (DeepSpeed's
        # launcher sets it; torchrun sets LOCAL_WORLD_SIZE).
        os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
        op.initialize(dist.get_world_size(), dist.get_rank())
        import torch
        if hasattr(op, "inference_all_reduce"):  # older DeepSpeed: a pybind11 function
            return (lambda t: op.inference_all_reduce(t)), ""
        return (lambda t: torch.ops.deepspeed.inference_all_reduce_(t)), ""  # a torch op
    except Exception as e:  # noqa: BLE001
        return None, f"DeepSpeed's shm op did not build or start ({type(e).__name__}: {e})"


def time_calls(calls, reps, dist, group, rounds=9):
    """{name: seconds per call}: rounds of `reps / rounds` calls of each backend in turn (the order
    reversed every other round), so a burst of load from other processes hits every backend; the
    median over rounds, then the slower rank's."""
    import torch
    for fn in calls.values():
        fn()
        fn()
    batch = max(1, reps // rounds)
    times = {name: [] for name in calls}
    for r in range(rounds):
        order = list(calls.items())
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            times[name].append((time.perf_counter() - t0) / batch)
    names = list(calls)
    t = torch.tensor([statistics.median(times[n]) for n in names], dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(names, t.tolist()))


def make_call(op, nbytes, world, group, dist, torch):
    n = max(nbytes // 4, 1)
    n -= n % world if n >= world else 0
    if op == "all_reduce":
        x = torch.ones(n)
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        if n < world:
            return None
        out, x = torch.empty(n), torch.ones(n // world)
        return lambda: dist.all_gather_into_tensor(out, x, group=group)
    if op == "reduce_scatter":
        if n < world:
            return None
        x, out = torch.ones(n), torch.empty(n // world)
        return lambda: dist.reduce_scatter_tensor(out, x, group=group)
    if n < world:
        return None
    x, out = torch.ones(n), torch.empty(n)
    return lambda: dist.all_to_all_single(out, x, group=group)


def ddp_step_times(groups, dist, torch):
    """Seconds per DDP step (forward, backward, SGD) of the tests' model on each group."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests", "torch", "workers"))
    import train  # the tests' model
    import torch.nn.functional as F
    x, y = train.batch(0, dist.get_rank())
    steps = {}
    for name, g in groups.items():
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(train.Model(), process_group=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(model=model, opt=opt):
            loss = F.cross_entropy(model(x).reshape(-1, train.V), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps[name] = step
    return time_calls(steps, 90, dist, dist.group.WORLD)


def worker(args):
    import torch
    import torch.distributed as dist
    import meshrt.torch  # noqa: F401
    dist.init_process_group("meshrt")
    world = dist.get_world_size()
    groups = {"meshrt": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    ds, why = deepspeed_allreduce()
    rows = []
    ops = args.ops.split(",") if args.ops else OPS
    for op in ops:
        for nbytes in [b for b in SIZES if not args.max_bytes or b <= args.max_bytes]:
            row = {"op": op, "bytes": nbytes}
            calls = {}
            for name, g in groups.items():
                call = make_call(op, nbytes, world, g, dist, torch)
                if call is not None:
                    calls[name] = call
            if op == "all_reduce" and ds is not None:
                x = torch.ones(max(nbytes // 4, 1))
                calls["deepspeed"] = lambda x=x: ds(x)
            if calls:
                row.update(time_calls(calls, reps_for(nbytes), dist, groups["meshrt"]))
            rows.append(row)
    # The 8 B all-reduce both ways: async_op=False runs inline on the calling thread when the
    # stream is idle; async_op=True, then wait(), hands the call to the stream's thread and back.
    x8 = torch.ones(2)
    inline = time_calls({"inline": lambda: dist.all_reduce(x8),
                         "handoff": lambda: dist.all_reduce(x8, async_op=True).wait()},
                        reps_for(8), dist, groups["meshrt"])
    whole = not args.ops and not args.max_bytes
    ddp = ddp_step_times(groups, dist, torch) if whole or args.ddp else None
    if dist.get_rank() == 0:
        report(rows, ddp, inline, why, world, args)
    dist.destroy_process_group()


def fmt(t):
    if t is None:
        return "n/a"
    return f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def report(rows, ddp, inline, ds_why, world, args):
    print(f"torch.distributed, {world} processes, float32, median time per call (slower rank)")
    print("| op | size | meshrt | gloo | gloo / meshrt | DeepSpeed shm |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        m, g = r.get("meshrt"), r.get("gloo")
        ratio = f"{g / m:.1f}x" if m and g else "n/a"
        d = fmt(r["deepspeed"]) if "deepspeed" in r else "-"
        print(f"| {r['op']} | {human(r['bytes'])} | {fmt(m)} | {fmt(g)} | {ratio} | {d} |")
    print(f"meshrt 8 B all_reduce: async_op=False (inline) {fmt(inline['inline'])}, "
          f"async_op=True then wait() (stream hand-off) {fmt(inline['handoff'])}")
    if ddp:
        print(f"DDP step (tests/torch model): meshrt {fmt(ddp['meshrt'])}, "
              f"gloo {fmt(ddp['gloo'])}, gloo / meshrt {ddp['gloo'] / ddp['meshrt']:.2f}x")
    if ds_why:
        print(f"DeepSpeed: skipped: {ds_why}")
    for r in rows:
        for k, v in r.items():
            if k.endswith("_error"):
                print(f"{k[:-6]} {r['op']} {human(r['bytes'])}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ddp_step": ddp, "all_reduce_8B": inline,
                       "deepspeed_skipped": ds_why}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--ops", default="", help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--max-bytes", type=int, default=0, help="only sizes up to this many bytes")
    ap.add_argument("--ddp", action="store_true", help="the DDP step too with --ops / --max-bytes")
    args = ap.parse_args()
    unknown = [o for o in args.ops.split(",") if args.ops and o not in OPS]
    if unknown:
        ap.error(f"--ops: unknown op(s) {unknown}; choose from {OPS}")
    if "RANK" not in os.environ:
        # The script's own options, less --nproc (torchrun would take it for its --nproc-per-node).
        own = [a for i, a in enumerate(sys.argv[1:]) if a != "--nproc" and not a.startswith(
            "--nproc=") and (i == 0 or sys.argv[i] != "--nproc")]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.nproc}", os.path.abspath(__file__)] + own
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        sys.exit(subprocess.call(cmd, env=env))
    worker(args)


if __name__ == "__main__":
    main()
