#!/bin/sh
# The same training run as 2 host threads and as 2 processes started by hand with torchrun's
# variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT): the processes
# meet over TCP, run on the shm backend (the one CPU backend that serves processes without MPI)
# and print the same loss curve.
# Usage: train_processes_match_threads.sh <meshrt>
set -eu
meshrt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args="train --mesh dp=2 --steps 4 --hidden 64 --heads 4 --seq 16 --vocab 128 --batch 4"
threads=$("$meshrt" $args --devices cpu:2 2>/dev/null | grep '^step' | awk '{print $2, $4}')
# A port nothing listens on (meshrt's rendezvous takes MASTER_PORT + 1).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1] - 1)')
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MESHRT_COMM_TIMEOUT=60 \
    "$meshrt" $args --devices cpu >"$work/out$r.txt" 2>"$work/err$r.txt" &
done
wait
procs=$(grep '^step' "$work/out0.txt" | awk '{print $2, $4}')
echo "threads:"; echo "$threads"
echo "processes:"; echo "$procs"
head -3 "$work/out0.txt"
cat "$work/err0.txt" "$work/err1.txt"
[ -n "$threads" ] && [ "$threads" = "$procs" ]
