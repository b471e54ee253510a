#!/usr/bin/env bash
# Runs every libFuzzer target of a MESHRT_FUZZ=ON build for a bounded time each (`make fuzz`, CI).
# Usage: tests/fuzz/run.sh <build dir> [seconds per target, default 60] [target names...]
# Each target starts from its seed corpus (tests/fuzz/corpus/<name>/, read only) and keeps what
# it finds in <build>/fuzz-corpus/<name>/; a crash, hang (> 10 s for one input), sanitizer report
# or allocation over 2 GiB (-malloc_limit_mb) is written to <build>/fuzz-artifacts/<name>/ and
# fails the run. To keep a finding as a regression test: fix it, then copy the artifact into
# tests/fuzz/corpus/<name>/ (ctest's fuzz.<name>.corpus replays it on every `make test`).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:?usage: run.sh <build dir> [seconds] [targets...]}"
secs="${2:-60}"
shift $(($# >= 2 ? 2 : $#))
build="$(cd "$build" && pwd)"
bins=()
if [ $# -gt 0 ]; then
  for n in "$@"; do bins+=("$build/fuzz/fuzz_$n"); done
else
  for b in "$build"/fuzz/fuzz_*; do [ -x "$b" ] && bins+=("$b"); done
fi
if [ ${#bins[@]} -eq 0 ]; then
  echo "run.sh: no fuzz targets in $build/fuzz (configure with -DMESHRT_FUZZ=ON, clang)" >&2
  exit 1
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Targets run FUZZ_JOBS at a time (default: the number of cores), each on one core for `secs`.
jobs="${FUZZ_JOBS:-$(nproc)}"
results="$build/fuzz-artifacts/results"
rm -rf "$results"
mkdir -p "$results"
run_one() {
  local bin="$1" name seeds work art log rc execs cov
  name="$(basename "$bin")"
  name="${name#fuzz_}"
  seeds="$root/tests/fuzz/corpus/$name"
  work="$build/fuzz-corpus/$name"
  art="$build/fuzz-artifacts/$name"
  mkdir -p "$work" "$art"
  log="$build/fuzz-artifacts/$name.log"
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$art/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    echo "$name: ok, ${execs:-?} inputs in ${secs} s, ${cov:-cov: ?} edges" >"$results/$name.ok"
  else
    {
      echo "$name: FAILED (exit $rc): $(ls "$art" | head -3 | tr '\n' ' ') -- see $log"
      grep -m1 -A12 'ERROR:\|runtime error\|==ERROR\|deadly signal\|timeout' "$log" | sed 's/^/    /'
    } >"$results/$name.failed"
  fi
}
for bin in "${bins[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_one "$bin" &
done
wait
echo "== fuzzing (${secs} s per target, ${jobs} at a time)"
fail=0
for f in "$results"/*; do
  sed -n '1p' "$f" | sed 's/^/  /'
  case "$f" in *.failed) fail=1; sed -n '2,$p' "$f" ;; esac
done
[ "$(ls "$results" | wc -l)" -eq ${#bins[@]} ] || { echo "  some targets left no result"; fail=1; }
exit $fail
