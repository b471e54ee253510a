#!/bin/sh
# Host (ranks = threads) vs MPI (ranks = processes, OpenMPI) all-reduce on 2 ranks, and the
# memcpy bound, measured back to back in one run. Prints medians over the repetitions as a
# markdown table (the figures in bench/results/collectives-host.md come from this script).
# Usage: bench/collective/compare_host_mpi.sh [build-dir] [repeats] [size] [dtype]
set -eu
build=${1:-build}
reps=${2:-7}
size=${3:-64M}
dtype=${4:-f32}
bin="$build/bin/meshrt-bench-collective"
[ -x "$bin" ] || { echo "no $bin: build the meshrt-bench-collective target first" >&2; exit 2; }
mpirun="mpirun"
[ "$(id -u)" = 0 ] && mpirun="mpirun --allow-run-as-root"
out=$(mktemp -d)
common="-b $size -e $size -d $dtype -w 5 -n 20"
i=1
while [ "$i" -le "$reps" ]; do
  "$bin" --devices cpu:2 --backend host $common --memcpy-bound --json "$out/host.$i.json" >/dev/null
  $mpirun -np 2 --bind-to none "$bin" --devices cpu --backend mpi $common \
    --json "$out/mpi.$i.json" >/dev/null
  i=$((i + 1))
done
python3 - "$out" "$reps" "$size" "$dtype" <<'PY'
import json, statistics, sys
d, reps, size, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(kind):
    return [json.load(open(f"{d}/{kind}.{i}.json")) for i in range(1, reps + 1)]
host, mpi = load("host"), load("mpi")
def med(runs, place, key="algbw_gbps"):
    return statistics.median(r["results"][0][place][key] for r in runs)
def medt(runs, place):
    return statistics.median(r["results"][0][place]["time_us"]["avg"] for r in runs)
mem = statistics.median(r["memcpy_gbps_per_rank"] for r in host)
wrong = sum(r["wrong_total"] for r in host + mpi)
print(f"all_reduce {size} {dtype}, 2 ranks, medians of {reps} runs (20 timed iterations each); #wrong total {wrong}")
print()
print("| backend | place | time (us) | algbw (GB/s) | busbw (GB/s) | vs MPI | vs memcpy bound |")
print("|---|---|---:|---:|---:|---:|---:|")
for place in ("out_of_place", "in_place"):
    m = med(mpi, place)
    for name, runs in (("host (threads)", host), ("mpi (OpenMPI, 2 processes)", mpi)):
        a = med(runs, place)
        print(f"| {name} | {place.replace('_', '-')} | {medt(runs, place):.0f} | {a:.2f} | "
              f"{med(runs, place, 'busbw_gbps'):.2f} | {a / m:.2f}x | {100 * a / mem:.0f}% |")
print()
print(f"memcpy bound: {mem:.2f} GB/s per rank (both ranks copying {size} at once, median)")
PY
rm -rf "$out"
