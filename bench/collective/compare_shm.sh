#!/bin/sh
# shm (2 processes under mpirun) vs mpi (Open MPI's data path, the same processes) vs the threads
# backend (host, 2 threads of one process): all-reduce at 8 B, 256 KiB and 64 MiB, the three
# backends run alternately (one of each per repetition) so that load changes hit all three.
# Prints the medians over the repetitions as a markdown table with ratios against the peers of
# the same run and the memcpy bound (bench/results/shm.md).
# Usage: bench/collective/compare_shm.sh [build-dir] [repeats] [dtype]
set -eu
build=${1:-build}
reps=${2:-5}
dtype=${3:-f32}
bin="$build/bin/meshrt-bench-collective"
[ -x "$bin" ] || { echo "no $bin: build the meshrt-bench-collective target first" >&2; exit 2; }
mpirun="mpirun"
[ "$(id -u)" = 0 ] && mpirun="mpirun --allow-run-as-root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
i=1
while [ "$i" -le "$reps" ]; do
  for size in 8 256K 64M; do
    n=200
    [ "$size" = 64M ] && n=20
    common="-b $size -e $size -d $dtype -w 5 -n $n"
    "$bin" --devices cpu:2 --backend host $common --memcpy-bound \
      --json "$out/host.$size.$i.json" >/dev/null
    $mpirun -np 2 --bind-to none "$bin" --devices cpu --backend shm $common \
      --json "$out/shm.$size.$i.json" >/dev/null
    $mpirun -np 2 --bind-to none "$bin" --devices cpu --backend mpi $common \
      --json "$out/mpi.$size.$i.json" >/dev/null
  done
  i=$((i + 1))
done
python3 - "$out" "$reps" "$dtype" <<'PY'
import json, statistics, sys
d, reps, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(kind, size):
    return [json.load(open(f"{d}/{kind}.{size}.{i}.json")) for i in range(1, reps + 1)]
def med(runs, place, key):
    return statistics.median(r["results"][0][place][key] for r in runs)
def medt(runs, place):
    return statistics.median(r["results"][0][place]["time_us"]["avg"] for r in runs)
print(f"all_reduce {dtype} sum, 2 ranks, medians of {reps} alternating runs "
      "(200 timed iterations, 20 at 64 MiB; time = the ranks' average)")
print()
print("| size | place | threads (us) | shm (us) | mpi (us) | shm algbw / mpi | shm / threads "
      "(algbw) | shm vs memcpy bound |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
wrong = 0
for size in ("8", "256K", "64M"):
    runs = {k: load(k, size) for k in ("host", "shm", "mpi")}
    wrong += sum(r["wrong_total"] for k in runs for r in runs[k])
    mem = statistics.median(r["memcpy_gbps_per_rank"] for r in runs["host"])
    for place in ("out_of_place", "in_place"):
        t = {k: medt(v, place) for k, v in runs.items()}
        a = {k: med(v, place, "algbw_gbps") for k, v in runs.items()}
        bound = f"{100 * a['shm'] / mem:.0f}%" if size == "64M" else ""
        print(f"| {size} | {place.replace('_', '-')} | {t['host']:.1f} | {t['shm']:.1f} | "
              f"{t['mpi']:.1f} | {a['shm'] / a['mpi']:.2f}x | {100 * a['shm'] / a['host']:.0f}% "
              f"| {bound} |")
print()
print(f"#wrong total {wrong}")
PY
