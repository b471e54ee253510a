#!/usr/bin/env python3
"""Every host collective against the memcpy bound, its 256 KiB time and its 8-byte latency.

Usage: bench/collective/ops_vs_memcpy.py MESHRT [ROUNDS] [DEVICES]

Runs `MESHRT bench collective` for each op in turn, ROUNDS times (default 5), alternating the
ops round by round so that a change of the machine's load moves every op alike, and prints a
Markdown table of the medians:
- 64 MiB: the fraction of the memcpy bound out of place and in place (`--memcpy-bound`: the
  traffic a rank needs at the memcpy bandwidth every rank gets at once, over its time);
- 256 KiB: the time out of place and in place (us);
- 8 bytes: the latency out of place and in place (us), 2000 iterations.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


def run(meshrt, devices, op, size, iters, bound):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        cmd = [meshrt, "bench", "collective", "--op", op, "--devices", devices, "--backend",
               "host", "-b", size, "-e", size, "-w", "20" if iters > 100 else "3", "-n",
               str(iters), "--json", path]
        if bound:
            cmd.append("--memcpy-bound")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)["results"][0]
    finally:
        os.unlink(path)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    meshrt = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    devices = sys.argv[3] if len(sys.argv) > 3 else "cpu:2"
    figs = {op: {k: [] for k in ("bound_out", "bound_in", "mid_out", "mid_in", "lat_out",
                                 "lat_in")} for op in OPS}
    for _ in range(rounds):
        for op in OPS:
            big = run(meshrt, devices, op, "64M", 10, True)
            mid = run(meshrt, devices, op, "256K", 200, False)
            lat = run(meshrt, devices, op, "8", 2000, False)
            f = figs[op]
            f["bound_out"].append(big["out_of_place"]["memcpy_bound_fraction"])
            f["bound_in"].append(big["in_place"]["memcpy_bound_fraction"])
            f["mid_out"].append(mid["out_of_place"]["time_us"]["avg"])
            f["mid_in"].append(mid["in_place"]["time_us"]["avg"])
            f["lat_out"].append(lat["out_of_place"]["time_us"]["avg"])
            f["lat_in"].append(lat["in_place"]["time_us"]["avg"])
    print(f"{devices}, host backend, medians of {rounds} alternating rounds\n")
    print("| op | 64 MiB vs memcpy bound, out of place | in place | 256 KiB us, out of place "
          "| in place | 8 B latency us, out of place | in place |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for op in OPS:
        m = {k: statistics.median(v) for k, v in figs[op].items()}
        print(f"| {op} | {100 * m['bound_out']:.0f}% | {100 * m['bound_in']:.0f}% | "
              f"{m['mid_out']:.1f} | {m['mid_in']:.1f} | {m['lat_out']:.1f} | "
              f"{m['lat_in']:.1f} |")


if __name__ == "__main__":
    main()
