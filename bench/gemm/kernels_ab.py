#!/usr/bin/env python3
"""Kernels table of `meshrt bench gemm`, before / after, on a shared machine.

Runs each binary's elementwise table RUNS times, alternating binaries and dtypes (f32, bf16) so
that all of them see the same load, and prints a markdown table of the medians per row: GB/s and
the fraction of the memcpy measured in the same invocation. Also prints the 1-minute load average
seen at each start (min / median / max).

  bench/gemm/kernels_ab.py RUNS LABEL=BINARY [LABEL=BINARY ...] [-- extra bench args]
  e.g. bench/gemm/kernels_ab.py 11 before=/tmp/before/meshrt after=build/bin/meshrt -- --repeats 15
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[: args.index("--")]
    if len(args) < 2:
        sys.exit(__doc__)
    runs = int(args[0])
    bins = [a.split("=", 1) for a in args[1:]]
    dtypes = ("f32", "bf16")
    res = {}  # (label, dtype) -> op -> [(gbs, fraction of memcpy)]
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for dt in dtypes:
                for label, binary in bins:
                    with open("/proc/loadavg") as f:
                        loads.append(float(f.read().split()[0]))
                    out = os.path.join(tmp, "k.json")
                    subprocess.run([binary, "bench", "gemm", "--no-gemm", "--no-attention",
                                    "--devices", "cpu", "--dtype", dt, "--json", out] + extra,
                                   check=True, stdout=subprocess.DEVNULL)
                    with open(out) as f:
                        rows = json.load(f)["elementwise"]
                    copy = rows[0]["gbs"]
                    d = res.setdefault((label, dt), {})
                    for r in rows:
                        d.setdefault(r["op"], []).append((r["gbs"], r["gbs"] / copy))
    print(f"runs {runs}, load (1-min) min {min(loads):.1f} median "
          f"{statistics.median(loads):.1f} max {max(loads):.1f}\n")
    head = "| op |"
    for dt in dtypes:
        for label, _ in bins:
            head += f" {dt} GB/s {label} | {dt} vs memcpy {label} |"
    print(head)
    print("| --- |" + " ---: | ---: |" * (len(dtypes) * len(bins)))
    for op in res[(bins[0][0], dtypes[0])]:
        line = f"| {op} |"
        for dt in dtypes:
            for label, _ in bins:
                v = res[(label, dt)][op]
                line += (f" {statistics.median(x[0] for x in v):.2f} |"
                         f" {statistics.median(x[1] for x in v):.2f}x |")
        print(line)


if __name__ == "__main__":
    main()
