#!/bin/sh
# A straggler that is not injected: under mpirun, rank 0 runs alone on one core and rank 1, at
# nice 10, on another core that two busy loops share with it (taskset), so rank 1 gets about a
# twentieth of its core and rank 0 all of its own; other load on the machine (nice 0) takes more
# from rank 1 than from rank 0, so the gap only widens under load. `meshrt train` must name rank 1
# once on its log, in its summary line and in the metrics records (docs/watching.md), and never
# rank 0.
# Usage: straggler_busy_core.sh <meshrt> <mpirun.sh> <mpiexec> [mpiexec flags...]
set -u
meshrt="$1"
shift
command -v taskset >/dev/null 2>&1 || { echo "SKIP: no taskset"; exit 77; }
# The first two CPUs this process may run on.
cpus=$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
[ "$(echo $cpus | wc -w)" -ge 2 ] || { echo "SKIP: needs 2 CPUs, has: $cpus"; exit 77; }
c0=${cpus% *}
c1=${cpus#* }
tmp=$(mktemp -d)
spinners=
cleanup() {
  for p in $spinners; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  cat "$tmp/out" "$tmp/err" 2>/dev/null
  exit 1
}
for _ in 1 2; do
  timeout 300 taskset -c "$c1" sh -c 'while :; do :; done' &
  spinners="$spinners $!"
done
export MESHRT_FLIGHT_DIR="$tmp"
# Each rank pinned to its own CPU: rank 0 to c0, rank 1 (niced) to the busy c1.
"$@" -np 2 sh -c 'c=$1 n=0; shift; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && c=$1 n=10; shift
  exec nice -n "$n" taskset -c "$c" "$@"' \
  sh "$c0" "$c1" "$meshrt" train --devices cpu --hidden 256 --heads 4 --seq 64 --batch 8 \
  --steps 10 --straggler-steps 3 --metrics "$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" ||
  fail "train exited with $?"
grep -v '^step ' "$tmp/out"
grep -q '^warning: straggler: rank 1 (cpu:0) computes .* for 3 steps in a row' "$tmp/out" ||
  fail "no straggler warning naming rank 1"
[ "$(grep -c '^warning: straggler' "$tmp/out")" -eq 1 ] || fail "the warning is not given once"
grep -q '^train: 10 of 10 steps, finished; .*; straggler: rank 1 (cpu:0) ' "$tmp/out" ||
  fail "the summary line does not name rank 1"
! grep -q 'straggler: rank 0' "$tmp/out" || fail "rank 0 named a straggler"
python3 - "$tmp/m.jsonl" <<'PY' || fail "the metrics records do not name rank 1"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 10, len(recs)
last = recs[-1]
assert last["straggler_rank"] == 1, last["straggler_rank"]
c0, c1 = (r["compute_ms"] for r in last["ranks"])
# Rank 1 gets a small share of its CPU: it computes many times slower; 1.5x is far from both.
assert c1 > 1.5 * c0, (c0, c1)
print(f"metrics: straggler_rank 1, compute rank 0 {c0:.1f} ms, rank 1 {c1:.1f} ms ({c1 / c0:.2f}x)")
PY
echo PASS
