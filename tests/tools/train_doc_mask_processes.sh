#!/bin/sh
# `meshrt train --doc-mask --mesh cp=2` as 2 processes started by hand with torchrun's variables
# (TCP rendezvous on 127.0.0.1, the shm backend), ring and allgather: every step's loss equals the
# doc-masked cp=1 run's on one thread within f32 rounding (the losses print with 6 decimals), on
# packed documents of 1 to 13 tokens that cross the chunk boundaries.
# Usage: train_doc_mask_processes.sh <meshrt>
set -eu
meshrt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/docs.u16" <<'PY'
import struct, sys
x, t = 12345, []
def nxt():
    global x
    x = (x * 1103515245 + 12345) % 2**32
    return x >> 16
while len(t) < 4096:
    n = 1 + nxt() % 13
    t += [1 + nxt() % 63 for _ in range(n - 1)] + [0]
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(t), *t))
PY
args="train --data $work/docs.u16 --doc-mask --eot-token 0 --vocab 64 --hidden 32 --heads 4 \
--layers 1 --seq 16 --batch 4 --steps 5"
# shellcheck disable=SC2086
"$meshrt" $args --devices cpu:1 >"$work/ref.txt" 2>&1 || { cat "$work/ref.txt"; exit 1; }
for how in ring allgather; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1] - 1)')
  pids=""
  for r in 0 1; do
    # shellcheck disable=SC2086
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MESHRT_COMM_TIMEOUT=60 \
      "$meshrt" $args --devices cpu --mesh cp=2 --cp-comm $how >"$work/out$r.txt" 2>"$work/err$r.txt" &
    pids="$pids $!"
  done
  rc=0
  for p in $pids; do wait "$p" || rc=$?; done
  echo "== $how: rank 0"; cat "$work/out0.txt" "$work/err0.txt" "$work/err1.txt"
  [ "$rc" = 0 ] || { echo "FAIL: a rank exited $rc"; exit 1; }
  python3 "$(dirname "$0")/same_losses.py" "$work/ref.txt" "$work/out0.txt" 5 2e-6
done
echo OK
