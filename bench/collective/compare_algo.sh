#!/bin/sh
# Two meshrt binaries (before / after a change to the collectives) on the threads (cpu:2), shm
# and mpi (2 processes under mpirun) backends: all_reduce, all_gather and reduce_scatter at 8 B
# (32 B for all_gather and reduce_scatter: the smallest size the benchmark runs for them),
# 256 KiB and 64 MiB, the two binaries alternating within each repetition so that load changes
# hit both. The figure is `--latency`'s: each iteration timed alone, the median over the
# iterations of the slowest rank (robust to a loaded machine's stalls, unlike the mean). Prints
# the medians over the repetitions as a markdown table, new / old per cell, then the spread of
# each binary over the repetitions (min - max) (bench/results/collective-algorithms.md).
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
# ALGO_BENCH_KEEP=<folder>: keep the runs' JSON files there.
if [ -n "${ALGO_BENCH_KEEP:-}" ]; then
  out=$ALGO_BENCH_KEEP
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
# run <binary> <backend> <json> <bench flags...>
run() {
  bin=$1 be=$2 json=$3
  shift 3
  if [ "$be" = host ]; then
    "$bin" bench collective "$@" --devices cpu:2 --backend host --latency --json "$json" >/dev/null
  else
    $mpirun -np 2 --bind-to none "$bin" bench collective "$@" --devices cpu --backend "$be" \
      --latency --json "$json" >/dev/null
  fi
}
i=1
while [ "$i" -le "$reps" ]; do
  for op in all_reduce all_gather reduce_scatter; do
    for be in host shm mpi; do
      for which in old new; do
        bin=$old
        [ "$which" = new ] && bin=$new
        # The small size and 256 KiB in one run, 64 MiB in another.
        small="-b 8 -f 32768"
        [ "$op" = all_reduce ] || small="-b 32 -f 8192"
        run "$bin" "$be" "$out/$which.$be.$op.small.$i.json" --op "$op" $small -e 256K -w 5 -n 200
        run "$bin" "$be" "$out/$which.$be.$op.large.$i.json" --op "$op" -b 64M -e 64M -w 2 -n 10
      done
    done
  done
  i=$((i + 1))
done
python3 - "$out" "$reps" <<'PY'
import json, statistics, sys
d, reps = sys.argv[1], int(sys.argv[2])
def figures(which, be, op, size, place):
    part, k = {"small": ("small", 0), "256K": ("small", 1), "64M": ("large", 0)}[size]
    runs = [json.load(open(f"{d}/{which}.{be}.{op}.{part}.{i}.json")) for i in range(1, reps + 1)]
    wrong = sum(r["wrong_total"] for r in runs)
    assert wrong == 0, f"{which} {be} {op} {size}: {wrong} wrong results"
    sizes[size] = runs[0]["results"][k]["size_bytes"]
    return [r["results"][k][place]["latency_us"]["median"] for r in runs]
def med(which, be, op, size, place):
    return statistics.median(figures(which, be, op, size, place))
def spread(which, be, op, size, place):
    f = figures(which, be, op, size, place)
    return f"{min(f):.1f} - {max(f):.1f}"
sizes = {}
print(f"f32 sum, 2 ranks, medians over {reps} alternating runs of each run's per-iteration "
      "median latency (slowest rank; 200 iterations, 10 at 64 MiB), us: out of place | in place")
print()
print("| backend | op | size | old out | new out | new/old | old in | new in | new/old |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
def name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"
for be in ("host", "shm", "mpi"):
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in ("small", "256K", "64M"):
            cells = []
            for place in ("out_of_place", "in_place"):
                o, n = med("old", be, op, size, place), med("new", be, op, size, place)
                cells += [f"{o:.1f}", f"{n:.1f}", f"{n / o:.2f}"]
            backend = {"host": "threads"}.get(be, be)
            print(f"| {backend} | {op} | {name(sizes[size])} | " + " | ".join(cells) + " |")
print()
print(f"Spread over the {reps} runs (min - max of the runs' figures), us")
print()
print("| backend | op | size | old out | new out | old in | new in |")
print("|---|---|---|---:|---:|---:|---:|")
for be in ("host", "shm", "mpi"):
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in ("small", "256K", "64M"):
            cells = [spread(w, be, op, size, p) for p in ("out_of_place", "in_place")
                     for w in ("old", "new")]
            backend = {"host": "threads"}.get(be, be)
            print(f"| {backend} | {op} | {name(sizes[size])} | " + " | ".join(cells) + " |")
PY
