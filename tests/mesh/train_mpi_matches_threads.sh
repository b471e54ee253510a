#!/bin/sh
# The same training run as 2 host threads and as 2 MPI processes prints the same loss curve.
# Usage: train_mpi_matches_threads.sh <meshrt> <mpirun.sh> <mpiexec> [mpiexec flags...]
set -eu
meshrt="$1"
shift
args="train --mesh dp=2 --steps 4 --hidden 64 --heads 4 --seq 16 --vocab 128 --batch 4"
threads=$("$meshrt" $args --devices cpu:2 2>/dev/null | grep '^step' | awk '{print $2, $4}')
procs=$("$@" -np 2 "$meshrt" $args --devices cpu 2>/dev/null | grep '^step' | awk '{print $2, $4}')
echo "threads:"; echo "$threads"
echo "mpi processes:"; echo "$procs"
[ -n "$threads" ] && [ "$threads" = "$procs" ]
