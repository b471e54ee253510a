#!/bin/bash
# Injects each fault (MESHRT_FAULT / --fault) into `meshrt bench collective` on the threads
# backend and under mpirun (2 and 4 ranks), and checks what the issue asks of each: every
# surviving rank exits within MESHRT_COMM_TIMEOUT + 5 s (threads; + 12 s under mpirun, whose launch and
# teardown count), a runtime message (not the injection's
# own line) names the faulty rank, `meshrt doctor` on the flight records names it, no process
# is left behind; `slow` completes with correct results and doctor reports the skew.
#
# Usage: tools/fault-matrix.sh MESHRT_BIN [--mpiexec PATH] [--backends "threads np2 np4 np4-mesh"]
#                              [--kinds "hang crash skip slow corrupt"] [--table FILE.md]
# Backends: threads (cpu:4), np2 / np4 (mpirun), np4-mesh (dp=2,tp=2 training under mpirun, hang
# only), threads-zero and np2-zero (dp=2 training with --zero 2 on cpu:2 / under mpirun: rank 1
# hangs or dies in its second parameter all-gather; hang and crash only), threads-zero3 and
# np2-zero3 (the same with --zero 3: rank 1 hangs or dies in its third parameter all-gather,
# inside step 1's forward prefetch of a piece's sharded parameters).
# Exits non-zero when any expectation fails; --table writes the results as a Markdown table.
set -u
bin="$1"
shift
mpiexec=mpirun
backends="threads np2 np4 np4-mesh"
kinds="hang crash skip slow corrupt"
table=""
while [ $# -gt 0 ]; do
  case "$1" in
    --mpiexec) mpiexec="$2"; shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    --kinds) kinds="$2"; shift 2 ;;
    --table) table="$2"; shift 2 ;;
    *) echo "fault-matrix: unknown argument $1" >&2; exit 2 ;;
  esac
done
T=2
# Seconds a run may take past the watchdog timeout: the fault's own wait plus start-up. Under
# mpirun that includes launching and tearing down 2-4 processes, which on a loaded 2-core machine
# took up to 7.4 s alone (seen once). Threads rows get as much: under TSan on a 2-core machine
# running a second CI, threads-zero crash took 7.6 s (the watchdog's 2 s, the abort's 3 s grace,
# and a TSan start-up and teardown of several seconds), past the old 5 s slack. A run that hangs
# instead is killed at limit + 20 s, so the check still tells a stuck run from a slow one.
slack_threads=12
slack_mpirun=12
root_flag=""
[ "$(id -u)" = 0 ] && root_flag="--allow-run-as-root"
rows=()
failures=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for backend in $backends; do
  for kind in $kinds; do
    case "$backend" in
      threads) R=1; launch=("$bin") ; devs=(--devices cpu:4) ;;
      threads-zero | threads-zero3) R=1; launch=("$bin") ; devs=(--devices cpu:2) ;;
      np2 | np2-zero | np2-zero3) R=1; launch=("$mpiexec" $root_flag -np 2 --bind-to none -x MESHRT_COMM_TIMEOUT -x MESHRT_COMM_DEBUG -x MESHRT_FLIGHT_DIR -x MESHRT_FLIGHT_ON_EXIT "$bin"); devs=() ;;
      # dp=2,tp=2 training: global rank 2 stops; every rank's watchdog must name rank 2 (global).
      np4-mesh) R=2; launch=("$mpiexec" $root_flag -np 4 --oversubscribe --bind-to none -x MESHRT_COMM_TIMEOUT -x MESHRT_COMM_DEBUG -x MESHRT_FLIGHT_DIR -x MESHRT_FLIGHT_ON_EXIT "$bin"); devs=() ;;
      np4) R=2; launch=("$mpiexec" $root_flag -np 4 --oversubscribe --bind-to none -x MESHRT_COMM_TIMEOUT -x MESHRT_COMM_DEBUG -x MESHRT_FLIGHT_DIR -x MESHRT_FLIGHT_ON_EXIT "$bin"); devs=() ;;
      *) echo "fault-matrix: unknown backend $backend" >&2; exit 2 ;;
    esac
    case "$kind" in
      slow) spec="slow@rank=$R,step=2,op=all_reduce,ms=100" ;;
      # The 13th all_reduce of this command line is the benchmark's result check.
      corrupt) spec="corrupt@rank=$R,step=13,op=all_reduce" ;;
      *) spec="$kind@rank=$R,step=3,op=all_reduce" ;;
    esac
    case "$backend" in threads*) limit=$((T + slack_threads)) ;; *) limit=$((T + slack_mpirun)) ;; esac
    dir="$work/$backend-$kind"
    mkdir -p "$dir"
    export MESHRT_COMM_TIMEOUT=$T MESHRT_FLIGHT_DIR="$dir" MESHRT_FLIGHT_ON_EXIT=0 MESHRT_COMM_DEBUG=0
    # A skipped collective shifts the rank's later calls against its peers': MPI matches the
    # mismatched calls blindly (undefined behaviour) unless MESHRT_COMM_DEBUG=1 compares them.
    # Corrupted data is caught by MESHRT_COMM_DEBUG=1's data check (checksums exchanged after
    # each collective).
    [ "$kind" = skip ] || [ "$kind" = corrupt ] && export MESHRT_COMM_DEBUG=1
    [ "$kind" = slow ] && export MESHRT_FLIGHT_ON_EXIT=1
    t0=$(date +%s.%N)
    if [ "$backend" = np4-mesh ]; then
      [ "$kind" = hang ] || continue
      spec="hang@rank=$R,step=10"
      cmd=(train --mesh dp=2,tp=2 --steps 4 --hidden 64 --layers 1 --fault "$spec")
    elif [ "${backend%-zero3}" != "$backend" ]; then
      # ZeRO 3's parameter all-gathers (the only all-gathers of a dp=2 mesh): each piece's
      # sharded parameters before its forward, the next piece's prefetched; the third is in
      # step 1's forward, before any update.
      [ "$kind" = hang ] || [ "$kind" = crash ] || continue
      spec="$kind@rank=$R,step=3,op=all_gather"
      cmd=(train "${devs[@]}" --mesh dp=2 --zero 3 --steps 4 --hidden 64 --layers 2 --fault "$spec")
    elif [ "${backend%-zero}" != "$backend" ]; then
      # ZeRO 2's parameter all-gathers (the only all-gathers of a dp=2 mesh): the second is in
      # step 2, after the first update.
      [ "$kind" = hang ] || [ "$kind" = crash ] || continue
      spec="$kind@rank=$R,step=2,op=all_gather"
      cmd=(train "${devs[@]}" --mesh dp=2 --zero 2 --steps 4 --hidden 64 --layers 1 --fault "$spec")
    else
      cmd=(bench collective "${devs[@]}" -b 4K -e 4K -w 2 -n 6 --fault "$spec")
    fi
    # Own session: every process it starts is found (and reaped) by its process group; a run
    # that outlives the limit by far is killed (and fails).
    setsid timeout -s KILL $((limit + 20)) "${launch[@]}" "${cmd[@]}" >"$dir/out.log" 2>&1 &
    pid=$!
    wait "$pid"
    rc=$?
    t1=$(date +%s.%N)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    sleep 0.5
    left=$(pgrep -g "$pid" | wc -l)
    [ "$left" -gt 0 ] && kill -9 -- -"$pid" 2>/dev/null
    # Named by the runtime: a line other than the injection's own naming the rank (watchdog,
    # mismatch, mpirun's report of the process that died).
    named=no
    if grep -v "injected fault" "$dir/out.log" |
      grep -Eq "(watchdog|mismatch|culprit|never arrived|data check).*rank $R([^0-9]|$)|Process name: \[\[[0-9]+,[0-9]+\],$R\]"; then
      named=yes
    fi
    doctor=no
    verdict=""
    if ls "$dir"/meshrt-flight-*.json >/dev/null 2>&1; then
      "$bin" doctor "$dir"/meshrt-flight-*.json >"$dir/doctor.log" 2>&1
      verdict=$(grep -E "^verdict:" "$dir/doctor.log" | head -1)
      echo "$verdict" | grep -Eq "rank $R([^0-9]|$)" && doctor=yes
    fi
    ok=yes
    why=""
    if [ "$backend" = np4-mesh ]; then
      # The ranks agree: every watchdog message (one per surviving rank) names global rank 2.
      wd=$(grep -c "watchdog:.*did not complete" "$dir/out.log")
      wd2=$(grep "watchdog:.*did not complete" "$dir/out.log" | grep -c "culprit: rank $R ")
      [ "$wd" -gt 0 ] && [ "$wd" -eq "$wd2" ] || { ok=no; why="$why watchdog-lines=$wd-naming-$R=$wd2"; }
    fi
    within=$(awk -v s="$secs" -v l="$limit" 'BEGIN { print (s <= l) ? "yes" : "no" }')
    # A slow run is not a failure: it ends when its (delayed) work is done.
    [ "$within" = yes ] || [ "$kind" = slow ] || { ok=no; why="$why slow-exit"; }
    [ "$left" -eq 0 ] || { ok=no; why="$why left=$left"; }
    case "$kind" in
      slow)
        [ "$rc" -eq 0 ] || { ok=no; why="$why rc=$rc"; }
        grep -q "Out of bounds values : 0 OK" "$dir/out.log" || { ok=no; why="$why wrong-results"; }
        [ "$doctor" = yes ] || { ok=no; why="$why doctor"; }
        ;;
      *)
        [ "$rc" -ne 0 ] || { ok=no; why="$why rc=0"; }
        [ "$named" = yes ] || { ok=no; why="$why not-named"; }
        [ "$doctor" = yes ] || { ok=no; why="$why doctor"; }
        ;;
    esac
    [ "$ok" = yes ] || failures=$((failures + 1))
    echo "fault-matrix: $backend $spec: rc=$rc ${secs}s named=$named doctor=$doctor left=$left -> $ok$why"
    [ "$ok" = yes ] || { echo "---- output"; tail -25 "$dir/out.log"; echo "---- doctor"; cat "$dir/doctor.log" 2>/dev/null; }
    rows+=("| $backend | \`$spec\` | $rc | $secs | $named | $doctor | $left | $ok |")
  done
done

if [ -n "$table" ]; then
  {
    echo "| backend | fault | exit status | seconds to exit | culprit named by the runtime | named by \`meshrt doctor\` | processes left | as expected |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } >"$table"
fi
echo "fault-matrix: $failures failure(s)"
[ "$failures" -eq 0 ]
