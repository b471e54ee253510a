#!/bin/sh
# --deterministic across backends and launches (issue 55): the same run as 1 thread, as 4 host
# threads (ZeRO 2), as 2 processes on the shm backend (file rendezvous, ZeRO 3, small buckets),
# and under mpirun as 3 processes on the MPI backend and as 4 on hier (2 simulated nodes) prints the same loss at
# every step and the same state digest (parameters and AdamW moments after the last step).
# Without the flag, the thread and 4-thread runs differ (the control).
# Usage: train_deterministic_backends.sh <meshrt> <mpirun.sh> <mpiexec> [mpiexec flags...]
set -eu
meshrt="$1"
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args="train --steps 6 --layers 1 --hidden 16 --heads 2 --ffn 40 --seq 8 --batch 12 --vocab 40 --lr 0.01"
# bits <output file>: the step losses (full printed precision) and the digest line.
bits() { grep -E '^(step|state digest)' "$1" | awk '/^step/ {print $2, $4} /^state/ {print $3}'; }
check() {
  if [ "$(bits "$work/$1.txt")" != "$(bits "$work/ref.txt")" ]; then
    echo "FAIL: $1 differs from the 1-thread run"
    cat "$work/ref.txt" "$work/$1.txt"
    exit 1
  fi
  echo "$1: same bits"
}
"$meshrt" $args --deterministic --devices cpu:1 >"$work/ref.txt"
grep -q '^state digest' "$work/ref.txt"
"$meshrt" $args --deterministic --devices cpu:4 --mesh dp=4 --zero 2 >"$work/threads4.txt"
check threads4
mkdir -p "$work/rdv"
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MESHRT_RENDEZVOUS="file://$work/rdv" MESHRT_COMM_TIMEOUT=60 \
    "$meshrt" $args --deterministic --devices cpu --mesh dp=2 --zero 3 --bucket-mb 0.002 \
    >"$work/shm$r.txt" 2>"$work/shm-err$r.txt" &
done
wait
cp "$work/shm0.txt" "$work/shm.txt"
check shm
"$@" -np 3 "$meshrt" $args --deterministic --devices cpu --mesh dp=3 --backend mpi \
  >"$work/mpi.txt" 2>"$work/mpi-err.txt" || { cat "$work/mpi-err.txt"; exit 1; }
check mpi
# hier: 4 ranks on 2 simulated nodes (MESHRT_NODE_ID = MPI rank / 2).
"$@" -np 4 sh -c 'MESHRT_NODE_ID=$((OMPI_COMM_WORLD_RANK / 2)) exec "$0" "$@"' "$meshrt" $args \
  --deterministic --devices cpu --mesh dp=4 --backend hier --micro-batches 3 \
  >"$work/hier.txt" 2>"$work/hier-err.txt" || { cat "$work/hier-err.txt"; exit 1; }
check hier
# The control: the same two thread layouts without the flag.
"$meshrt" $args --devices cpu:1 >"$work/plain1.txt"
"$meshrt" $args --devices cpu:4 --mesh dp=4 --zero 2 >"$work/plain4.txt"
if [ "$(bits "$work/plain1.txt")" = "$(bits "$work/plain4.txt")" ]; then
  echo "FAIL: without --deterministic dp=1 and dp=4 gave the same losses: the control shows nothing"
  exit 1
fi
echo "without --deterministic: dp=1 and dp=4 differ (as expected)"
