#!/bin/sh
# `meshrt train` on one GPU gives the host's losses: 5 steps of a small model on synthetic tokens,
# causal and with --doc-mask (packed documents ended by token 3), each step's loss within 1e-4
# relative of `--devices cpu:1`'s (f32 on both; cuBLASLt and the CUDA attention kernels sum in
# another order). Skips (77) where CUDA is unavailable.
# Usage: train_cuda_vs_host.sh <meshrt>
set -eu
meshrt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$meshrt" train --devices cuda:0 --steps 1 --hidden 32 --heads 2 --seq 16 --batch 2 \
  >"$work/probe.txt" 2>&1; then
  if grep -q "CUDA is unavailable\|no CUDA device\|not built with CUDA" "$work/probe.txt"; then
    echo "SKIP: $(tail -n 1 "$work/probe.txt")"
    exit 77
  fi
  cat "$work/probe.txt"
  exit 1
fi
args="train --hidden 64 --heads 4 --layers 2 --vocab 64 --seq 64 --batch 4 --steps 5"
for extra in "" "--doc-mask --eot-token 3"; do
  for dev in cpu:1 cuda:0; do
    # shellcheck disable=SC2086
    "$meshrt" $args $extra --devices $dev >"$work/$dev.txt" 2>&1 || { cat "$work/$dev.txt"; exit 1; }
  done
  echo "== train $extra"
  python3 "$(dirname "$0")/same_losses.py" "$work/cpu:1.txt" "$work/cuda:0.txt" 5 1e-4
done
echo OK
