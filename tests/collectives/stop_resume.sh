#!/bin/sh
# A process stopped (kill -STOP) for longer than MESHRT_COMM_TIMEOUT and resumed must fail with
# the watchdog's message, quietly: no "terminate called", no crash in teardown, no hang.
# Usage: stop_resume.sh <meshrt>
set -u
meshrt="$1"
out=$(mktemp)
dir=$(mktemp -d)
cd "$dir" || exit 1
# Rank 1 issues each all_reduce 1.5 s late (under the 2 s timeout), so the other ranks spend
# nearly all their time waiting inside a collective: the stop lands inside one, and on resume
# its deadline has passed.
MESHRT_COMM_TIMEOUT=2 "$meshrt" bench collective --devices cpu:4 -b 1M -e 1M -n 100000 \
  --fault slow@rank=1,step=3,op=all_reduce,ms=1500 >"$out" 2>&1 &
pid=$!
i=0
until grep -q "Rank  3" "$out" 2>/dev/null; do
  i=$((i + 1))
  [ $i -gt 300 ] && { echo "FAIL: no start within 30 s"; kill -9 "$pid"; exit 1; }
  sleep 0.1
done
sleep 4
kill -STOP "$pid"
sleep 4
kill -CONT "$pid"
i=0
while kill -0 "$pid" 2>/dev/null; do
  i=$((i + 1))
  [ $i -gt 150 ] && { echo "FAIL: still running 15 s after SIGCONT"; kill -9 "$pid"; exit 1; }
  sleep 0.1
done
wait "$pid"
rc=$?
cat "$out"
rm -rf "$dir" "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: exit status $rc (want 1)"; exit 1; }
echo "PASS"
