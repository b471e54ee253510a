#!/bin/sh
# A user's error that every rank of an mpirun job agrees on is not a fault: one error line, a
# failed job, no MPI abort and no flight record. With MESHRT_FLIGHT_DIR unset the records would
# go to ${TMPDIR:-/tmp}/meshrt-flight-<job id>, so TMPDIR is a scratch folder that must stay empty,
# as must the working directory. The cases: a checkpoint missing a rank file (agreed as the ranks
# read it) and a --save folder of another run (agreed as it is opened).
# Usage: agreed_error_mpi.sh <meshrt> <mpirun.sh> <mpiexec> [mpiexec flags...]
set -u
meshrt="$1"
shift
tmp=$(mktemp -d)
work="$tmp/work"
export TMPDIR="$tmp/tmpdir"
unset MESHRT_FLIGHT_DIR
mkdir "$work" "$TMPDIR"
cd "$work" || exit 1
fail() {
  echo "FAIL: $*"
  echo "-- output"
  cat "$tmp/out"
  rm -rf "$tmp"
  exit 1
}
small="--devices cpu --hidden 64 --ffn 128 --heads 4 --layers 1 --vocab 64 --seq 16 --batch 4"
"$@" -np 2 "$meshrt" train $small --steps 2 --save ck >"$tmp/out" 2>&1 ||
  fail "the checkpoint to break was not written"
rm "ck/step-00000002/rank-00001.safetensors"
for case in resume save; do
  echo "== $case"
  case $case in
    resume) args="--steps 4 --resume ck" want="rank-00001.safetensors (listed in" ;;
    save) args="--steps 2 --save ck" want="--save ck holds checkpoints of another run" ;;
  esac
  "$@" -np 2 "$meshrt" train $small $args >"$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  [ $rc -ne 0 ] || fail "exit status 0"
  [ "$(grep -c 'meshrt: error: ' "$tmp/out")" = 1 ] || fail "not exactly one error line"
  grep -qF -- "$want" "$tmp/out" || fail "no '$want'"
  ! grep -q "flight recorder\|aborting the MPI job\|MPI_ABORT" "$tmp/out" ||
    fail "treated as a fault (flight records or an MPI abort)"
  [ -z "$(ls "$TMPDIR")" ] || fail "flight records in TMPDIR: $(ls "$TMPDIR")"
  ! ls meshrt-flight-* >/dev/null 2>&1 || fail "flight records in the working directory"
done
rm -rf "$tmp"
echo PASS
