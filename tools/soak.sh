#!/usr/bin/env bash
# Soak run: `meshrt train` for many steps on 4 host ranks (dp=2, tp=2) with every stream task
# randomly delayed (MESHRT_STREAM_JITTER=1), checking that every loss is finite and that rank 0's
# allocator statistics are flat: peak allocated and reserved bytes from step 100 on all equal
# their value at step 100 (a leak, or a cache that keeps growing, fails it).
# Usage: tools/soak.sh [build dir (default: build)] [steps (default: 2000)] [train flags...]
# Prints the first and last step lines, the figures checked, and PASS or FAIL (exit status 1).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
steps="${2:-2000}"
shift $(($# >= 2 ? 2 : $#))
meshrt="$build/bin/meshrt"
[ -x "$meshrt" ] || { echo "soak: no $meshrt; build first (make build)" >&2; exit 1; }
[ "$steps" -gt 100 ] || { echo "soak: steps must be > 100 (flatness is checked from step 100)" >&2; exit 1; }
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
MESHRT_STREAM_JITTER=1 "$meshrt" train --devices cpu:4 --mesh dp=2,tp=2 --steps "$steps" \
  --hidden 64 --heads 4 --seq 32 --batch 8 --vocab 256 --layers 2 --mem-stats "$@" >"$log" 2>&1
rc=$?
secs=$(($(date +%s) - start))
grep '^step 1 ' "$log"
grep '^step ' "$log" | tail -1
awk -v steps="$steps" -v rc="$rc" -v secs="$secs" '
  /^step [0-9]+ loss / {
    n++; s = $2 + 0; loss = $4
    if (loss !~ /^-?[0-9]+\.[0-9]+$/) { bad++; if (!firstbad) firstbad = s " (loss " loss ")" }
    for (i = 1; i <= NF; i++) {
      if ($i == "peak") peak = $(i + 1)
      if ($i == "reserved") res = $(i + 1)
    }
    if (s == 100) { peak100 = peak; res100 = res }
    if (s >= 100 && (peak != peak100 || res != res100)) {
      grew++; if (!firstgrew) firstgrew = s " (peak " peak ", reserved " res ")"
    }
    if (s == 1) { peak1 = peak; res1 = res }
    lastpeak = peak; lastres = res
  }
  END {
    printf "soak: %d of %d steps in %d s (exit status %d); non-finite losses: %d\n", n, steps, secs, rc, bad + 0
    printf "soak: peak allocated %s B, reserved %s B at step 1; %s / %s at step 100; %s / %s at the last step\n", peak1, res1, peak100, res100, lastpeak, lastres
    ok = rc == 0 && n == steps && bad == 0 && grew == 0 && peak100 != ""
    if (bad) printf "soak: first non-finite loss at step %s\n", firstbad
    if (grew) printf "soak: allocator statistics changed after step 100, first at step %s\n", firstgrew
    print ok ? "PASS" : "FAIL"
    exit ok ? 0 : 1
  }' "$log"
status=$?
[ $status -eq 0 ] || { echo "--- last lines of the run:"; tail -5 "$log"; }
exit $status
