#!/bin/sh
# `meshrt train` under mpirun stops cleanly on a signal, as docs/troubleshooting.md says:
# - SIGUSR2 to mpirun (which Open MPI forwards to every rank at once) stops every rank within
#   about a step, with the checkpoint of that step, and 128 + SIGUSR2;
# - SIGTERM to every rank (as a batch scheduler does) gives 128 + SIGTERM, SIGHUP to every rank
#   (the terminal closed) 128 + SIGHUP, SIGINT to one rank 128 + SIGINT (every rank agrees on the
#   signal);
# - SIGINT / SIGTERM to mpirun reach the ranks as SIGTERM only after odls_base_sigkill_timeout
#   seconds (Open MPI's kill sequence): they still stop cleanly within that time, with the
#   checkpoint of the step they stopped at. mpirun reads no output of its ranks from the signal
#   until they exit, so rank 0's lines fill the pipe (64 KiB, ~600 steps) and the rest is
#   dropped (runtime/logging.h: output never holds the run): the summary line is checked when it
#   got through, the checkpoint always;
# every rank stops after the same step, rank 0 prints one summary line, no process is left and no
# flight record is written (a graceful stop is no fault). A second signal ends the job at once.
# Output is matched line by line in rank 0's stdout, kept apart from stderr (log lines, mpirun's
# messages), so no interleaving of the two can break a match.
# Usage: train_signal_mpi.sh <meshrt> <mpirun.sh> <mpiexec> [mpiexec flags...]
set -u
# docs/troubleshooting.md's recipe: a little more than one step plus one checkpoint save. The
# model is small (a step takes ~20 ms on a quiet 2-core machine, ~1 s at a load of 18) and the timeout 10 s, so
# the stop holds on a loaded machine too (at hidden 512, steps of 5-9 s under that load outran a
# 5 s timeout and Open MPI killed the ranks before their summary).
export OMPI_MCA_odls_base_sigkill_timeout="${OMPI_MCA_odls_base_sigkill_timeout:-10}"
meshrt="$1"
shift
tmp=$(mktemp -d)
out="$tmp/out"
err="$tmp/err"
# Flight records (there must be none) go here; so would any in the working directory.
export MESHRT_FLIGHT_DIR="$tmp/flight"
mkdir "$MESHRT_FLIGHT_DIR"
cd "$tmp" || exit 1
pid=
fail() {
  echo "FAIL: $*"
  echo "-- stdout"
  cat "$out"
  echo "-- stderr"
  cat "$err"
  [ -n "$pid" ] && for r in $(pgrep -P "$pid"); do kill -KILL "$r"; done 2>/dev/null
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$tmp"
  exit 1
}
# The last step rank 0 printed (0 before the first).
last_step() { sed -n 's/^step \([0-9]*\) loss.*/\1/p' "$out" | tail -n 1 | grep . || echo 0; }
start() {
  n="$1"
  shift
  # Emptied here, not by the background job's redirection: the wait below must not see the
  # previous case's "step N" before the new job has truncated the file.
  : >"$out"
  : >"$err"
  "$@" -np 2 "$meshrt" train --devices cpu --hidden 256 --heads 4 --seq 64 --batch 4 \
    --steps 100000 $extra >"$out" 2>"$err" &
  pid=$!
  i=0
  until grep -q "^step $n " "$out" 2>/dev/null; do
    i=$((i + 1))
    [ $i -gt 1200 ] && fail "no step $n within 120 s"
    sleep 0.1
  done
}
ranks() { pgrep -P "$pid"; }  # mpirun's children: the two ranks
left_behind() {
  i=0
  while [ -n "$(ranks)" ] || kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1))
    [ $i -gt 100 ] && fail "processes left running: $(ranks)"
    sleep 0.1
  done
}

for how in mpirun-USR2 ranks-TERM ranks-HUP rank-INT mpirun-INT mpirun-TERM; do
  echo "== $how"
  ckpt="$tmp/ckpt-$how"
  extra=
  case $how in mpirun-*) extra="--save $ckpt" ;; esac
  start 2 "$@"
  seen=$(last_step)
  case $how in
    mpirun-*) kill -"${how#mpirun-}" "$pid" ;;
    ranks-TERM | ranks-HUP) for r in $(ranks); do kill -"${how#ranks-}" "$r"; done ;;
    rank-INT) kill -INT "$(ranks | tail -n 1)" ;;
  esac
  wait "$pid"
  rc=$?
  cat "$out"
  case $how in
    mpirun-USR2) sig=SIGUSR2 want=140 ;;
    ranks-TERM) sig=SIGTERM want=143 ;;
    ranks-HUP) sig=SIGHUP want=129 ;;
    rank-INT) sig=SIGINT want=130 ;;
    *) sig=SIGTERM want=any ;;  # mpirun's own status after its kill sequence
  esac
  [ $rc -ne 0 ] || fail "exit status 0 after a signal"
  [ "$want" = any ] || [ $rc -eq "$want" ] || fail "exit status $rc, not $want"
  summaries=$(grep -c '^train: ' "$out")
  if [ "$how" = mpirun-INT ] || [ "$how" = mpirun-TERM ]; then
    # The output after the signal may be lost (above); the checkpoint of the stop is not.
    [ -f "$ckpt/latest" ] || fail "no checkpoint written at the stop"
    n=$(sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' "$ckpt/latest")
    [ -n "$n" ] && [ "$n" -ge "$seen" ] || fail "latest is '$(cat "$ckpt/latest")', before step $seen"
    [ "$summaries" -le 1 ] || fail "more than one summary line"
    if [ "$summaries" -eq 1 ]; then
      grep -Eq "^train: $n of 100000 steps, stopped by $sig; last loss [0-9.]+; 0 skipped" \
        "$out" || fail "the summary is not 'stopped by $sig' at the checkpoint's step $n"
    fi
  else
    grep -Eq "^train: [0-9]+ of 100000 steps, stopped by $sig; last loss [0-9.]+; 0 skipped" \
      "$out" || fail "no summary line stopped by $sig"
    [ "$summaries" -eq 1 ] || fail "more than one summary line"
    n=$(sed -n 's/^train: \([0-9]*\) of.*/\1/p' "$out")
    [ "$(last_step)" = "$n" ] || fail "the summary's step $n is not the last step printed"
  fi
  if [ "$how" = mpirun-USR2 ]; then
    # Within about a step of the signal (the failure this guards against: 150+ steps), with
    # the checkpoint of the step it stopped at.
    [ "$n" -le $((seen + 10)) ] || fail "stopped at step $n, 10+ steps after $seen"
    grep -q "^checkpoint step $n -> " "$out" || fail "no checkpoint of step $n"
    [ "$(cat "$ckpt/latest")" = "$(printf 'step-%08d' "$n")" ] || fail "latest is not step $n"
  fi
  left_behind
  pid=
  [ -z "$(ls "$MESHRT_FLIGHT_DIR")" ] || fail "a graceful stop wrote flight records"
  ! ls meshrt-flight-* >/dev/null 2>&1 || fail "flight records in the working directory"
done

echo "== second signal"
# Open MPI's default kill timeout again (1 s): this case is about the ranks' second signal, and
# with the first stop done in a fast step mpirun's own abort of the job (SIGTERM, the timeout,
# SIGKILL) is what the wait below measures.
export OMPI_MCA_odls_base_sigkill_timeout=1
extra=
start 1 "$@"
for r in $(ranks); do kill -TERM "$r"; done
sleep 0.2
for r in $(ranks); do kill -TERM "$r"; done
i=0
while kill -0 "$pid" 2>/dev/null; do
  i=$((i + 1))
  [ $i -gt 100 ] && fail "still running 10 s after the second signal"
  sleep 0.1
done
wait "$pid"
rc=$?
cat "$out"
[ $rc -ne 0 ] || fail "exit status 0 after two signals"
left_behind
rm -rf "$tmp"
echo PASS
