#!/usr/bin/env bash
# CPU checks of tools/gpu-check.sh. Usage: gpu_check_test.sh no-gpu|missing-nvcc SCRIPT
#   no-gpu:       with every GPU hidden (CUDA_VISIBLE_DEVICES=) it fails fast with exit 3, naming
#                 the cause, and leaves its summary under the given $OUT
#   missing-nvcc: with nvcc on neither PATH nor CUDA_HOME it exits 2 naming nvcc
# Exit 0 when the expectation holds, 1 when not, 77 (skipped) when this machine lacks what the
# no-gpu check needs to get as far as the probe.
set -u
mode=$1 script=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  echo "--- summary.txt"
  cat "$tmp/out/summary.txt" 2>/dev/null
  exit 1
}
t0=$(date +%s)
case $mode in
  no-gpu)
    CUDA_VISIBLE_DEVICES= MESHRT_GPU_CHECK_STOP=probe MESHRT_GPU_BUILD=$tmp/build OUT=$tmp/out \
      "$script" >"$tmp/stdout" 2>&1
    rc=$?
    if [ $rc -eq 2 ]; then
      echo "SKIPPED: this machine lacks gpu-check's prerequisites:"
      grep MISSING "$tmp/out/summary.txt"
      exit 77
    fi
    [ $rc -eq 3 ] || fail "exit $rc, expected 3 (no usable GPU)"
    grep -q "NO USABLE GPU: .*[a-z]" "$tmp/out/summary.txt" || fail "summary does not say why"
    grep -q "no usable CUDA device: [a-zA-Z]" "$tmp/out/probe.txt" || fail "probe names no cause"
    [ -d "$tmp/build/CMakeFiles" ] && fail "it configured a build after the probe failed"
    ;;
  missing-nvcc)
    path=$(echo "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done |
      paste -sd:)
    PATH=$path CUDA_HOME=$tmp/no-cuda MESHRT_GPU_BUILD=$tmp/build OUT=$tmp/out "$script" \
      >"$tmp/stdout" 2>&1
    rc=$?
    [ $rc -eq 2 ] || fail "exit $rc, expected 2 (missing prerequisite)"
    grep -q "MISSING PREREQUISITES: .*nvcc" "$tmp/out/summary.txt" || fail "nvcc not named"
    ;;
  *)
    fail "unknown mode $mode"
    ;;
esac
el=$(($(date +%s) - t0))
[ $el -le 90 ] || fail "took $el s: not fast"
grep -q "done in" "$tmp/out/summary.txt" || fail "summary has no closing line"
echo "OK ($mode): exit $rc in $el s"
sed 's/^/  /' "$tmp/out/summary.txt"
