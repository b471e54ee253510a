#!/bin/sh
# Two meshrt binaries (before / after a change to the collectives) on the threads (cpu:2), shm
# and mpi (2 processes under mpirun) backends: all_reduce, all_gather and reduce_scatter at 8 B,
# 256 KiB and 64 MiB, the two binaries alternating within each repetition so that load changes
# hit both. Prints the medians as a markdown table, new / old per cell
# (bench/results/collectives-host.md, "The algorithm table").
# Usage: bench/collective/compare_algo.sh OLD_MESHRT NEW_MESHRT [repeats]
set -eu
old=$1
new=$2
reps=${3:-5}
for b in "$old" "$new"; do
  [ -x "$b" ] || { echo "no executable $b" >&2; exit 2; }
done
mpirun="mpirun"
[ "$(id -u)" = 0 ] && mpirun="mpirun --allow-run-as-root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
i=1
while [ "$i" -le "$reps" ]; do
  for op in all_reduce all_gather reduce_scatter; do
    for size in 8 256K 64M; do
      n=200
      [ "$size" = 64M ] && n=20
      common="bench collective --op $op -b $size -e $size -w 5 -n $n"
      for which in old new; do
        bin=$old
        [ "$which" = new ] && bin=$new
        "$bin" $common --devices cpu:2 --backend host --json "$out/$which.host.$op.$size.$i.json" >/dev/null
        $mpirun -np 2 --bind-to none "$bin" $common --devices cpu --backend shm \
          --json "$out/$which.shm.$op.$size.$i.json" >/dev/null
        $mpirun -np 2 --bind-to none "$bin" $common --devices cpu --backend mpi \
          --json "$out/$which.mpi.$op.$size.$i.json" >/dev/null
      done
    done
  done
  i=$((i + 1))
done
python3 - "$out" "$reps" <<'PY'
import json, statistics, sys
d, reps = sys.argv[1], int(sys.argv[2])
def med(which, be, op, size, place):
    runs = [json.load(open(f"{d}/{which}.{be}.{op}.{size}.{i}.json")) for i in range(1, reps + 1)]
    wrong = sum(r["wrong_total"] for r in runs)
    assert wrong == 0, f"{which} {be} {op} {size}: {wrong} wrong results"
    return statistics.median(r["results"][0][place]["time_us"]["avg"] for r in runs)
print(f"f32 sum, 2 ranks, medians of {reps} alternating runs (200 timed iterations, 20 at 64 MiB; "
      "time = the ranks' average, us), out of place / in place")
print()
print("| backend | op | size | old out | new out | new/old | old in | new in | new/old |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for be in ("host", "shm", "mpi"):
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in ("8", "256K", "64M"):
            cells = []
            for place in ("out_of_place", "in_place"):
                o, n = med("old", be, op, size, place), med("new", be, op, size, place)
                cells += [f"{o:.1f}", f"{n:.1f}", f"{n / o:.2f}"]
            name = {"host": "threads"}.get(be, be)
            print(f"| {name} | {op} | {size} | " + " | ".join(cells) + " |")
PY
