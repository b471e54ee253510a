#!/bin/sh
# `meshrt bench block --mesh cp=2` as 2 processes started by hand with torchrun's variables (TCP
# rendezvous on 127.0.0.1, the shm backend): both exchanges run, each reports the cp group and
# its K/V traffic, and the JSON says the run was 2 processes on shm with cp=2. (The numbers the
# cp block computes over processes are checked against the unsharded block by the C API's test
# `capi: attention on cp=2 over 2 shm processes equals the double loop`.)
# Usage: bench_cp_processes.sh <meshrt>
set -eu
meshrt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for how in ring allgather; do
  # A port nothing listens on (meshrt's rendezvous takes MASTER_PORT + 1).
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1] - 1)')
  pids=""
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MESHRT_COMM_TIMEOUT=60 \
      "$meshrt" bench block --devices cpu --mesh cp=2 --seq 32 --hidden 32 --heads 2 --steps 2 \
      --warmup 1 --no-calibrate --cp-comm $how --json "$work/$how.json" \
      >"$work/out$r.txt" 2>"$work/err$r.txt" &
    pids="$pids $!"
  done
  rc=0
  for p in $pids; do wait "$p" || rc=$?; done
  echo "== $how: rank 0 stdout"; cat "$work/out0.txt"
  echo "== stderr"; cat "$work/err0.txt" "$work/err1.txt"
  [ "$rc" = 0 ] || { echo "FAIL: a rank exited $rc"; exit 1; }
  grep -q "cp exchange $how" "$work/out0.txt" || { echo "FAIL: no 'cp exchange $how'"; exit 1; }
  python3 - "$work/$how.json" "$how" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
c = j["config"]
print("launch:", c["launch"], "cp:", c["cp"], "cp_comm:", c["cp_comm"])
assert c["cp"] == 2 and c["cp_comm"] == sys.argv[2], c
assert c["world_size"] == 2, c
assert "shm" in json.dumps(j), "no shm backend in the JSON"
assert j["comm"]["cp"]["bytes_per_step_per_rank"] > 0, j["comm"]["cp"]
PY
done
echo OK
