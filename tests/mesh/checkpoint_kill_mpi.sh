#!/bin/sh
# Under mpirun, rank 1 is killed (SIGKILL) while writing its checkpoint file: the previous
# checkpoint and `latest` survive, and resuming from them continues the uninterrupted loss curve.
# Usage: checkpoint_kill_mpi.sh <meshrt> <mpirun.sh> <mpiexec> [mpiexec flags...]
set -eu
meshrt="$1"
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/meshrt_ckpt_kill.XXXXXX")
trap 'rm -rf "$dir"' EXIT
args="train --mesh tp=2 --hidden 64 --heads 4 --seq 16 --vocab 130 --ffn 90 --batch 4"
losses() { grep '^step' | awk '{print $2, $4}'; }
full=$("$@" -np 2 "$meshrt" $args --steps 4 --devices cpu 2>/dev/null | losses)
"$@" -np 2 "$meshrt" $args --steps 2 --devices cpu --save "$dir/ck" >/dev/null 2>&1
[ "$(cat "$dir/ck/latest")" = step-00000002 ] || { echo "no first checkpoint"; exit 1; }
if MESHRT_CHECKPOINT_FAULT=rank=1,mode=kill "$@" -np 2 -x MESHRT_CHECKPOINT_FAULT "$meshrt" \
    $args --steps 4 --devices cpu --resume "$dir/ck" --save "$dir/ck" --save-every 1 \
    >"$dir/killed.log" 2>&1; then
  echo "the run with a killed rank exited 0"; cat "$dir/killed.log"; exit 1
fi
echo "killed run (rank 1 dies writing step 3):"; grep -E '^step|checkpoint' "$dir/killed.log" || true
ls -a "$dir/ck"
[ "$(cat "$dir/ck/latest")" = step-00000002 ] || { echo "latest moved"; exit 1; }
[ ! -e "$dir/ck/step-00000003" ] || { echo "a partial step-00000003 was published"; exit 1; }
ls -a "$dir/ck" | grep -q '^\.tmp-step-00000003-' || { echo "no temporary of the kill"; exit 1; }
# The next run on the folder (holding its lock) removes what the killed job left.
resumed=$("$@" -np 2 "$meshrt" $args --steps 4 --devices cpu --resume "$dir/ck" --save "$dir/ck" \
  2>/dev/null | losses)
if ls -a "$dir/ck" | grep -q '^\.tmp-'; then echo "stale temporaries left:"; ls -a "$dir/ck"; exit 1; fi
echo "uninterrupted:"; echo "$full"
echo "resumed from step 2:"; echo "$resumed"
[ -n "$resumed" ] && [ "$resumed" = "$(echo "$full" | tail -n 2)" ]
