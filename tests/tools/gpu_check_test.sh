#!/usr/bin/env bash
# CPU checks of tools/gpu-check.sh. Usage: gpu_check_test.sh no-gpu|missing-nvcc|stubbed SCRIPT
#   no-gpu:       with every GPU hidden (CUDA_VISIBLE_DEVICES=) it fails fast with exit 3, naming
#                 the cause, and leaves its summary under the given $OUT
#   missing-nvcc: with nvcc on neither PATH nor CUDA_HOME it exits 2 naming nvcc
#   stubbed:      with nvcc (whose probe "finds" a GPU), cmake, ctest, compute-sanitizer and nsys
#                 replaced by stubs, every step after the probe runs and passes (exit 0) and the
#                 sanitizer passes run test_kernels' [sanitize] cases; a failing sanitizer fails
#                 the run (exit 1); without compute-sanitizer both passes are logged as SKIPPED
#                 and the run passes
# Exit 0 when the expectation holds, 1 when not, 77 (skipped) when this machine lacks what the
# no-gpu / stubbed checks need to get past the prerequisites.
set -u
mode=$1 script=$2
# The script's step budgets are shares of its deadline, sized for the GPU machine; here the checks
# are of what the steps do, not of how fast a loaded CPU runs them (a nvcc probe build took 21+ s
# on 2 busy cores): an hour, so no budget runs out.
export MESHRT_GPU_DEADLINE=3600
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
  stubbed)
    stubs=$tmp/stubs
    mkdir -p "$stubs/bin" || fail "cannot create $stubs/bin"
    real_cuda=${CUDA_HOME:-/usr/local/cuda}
    ln -s "$real_cuda/include" "$stubs/include" # the prerequisite checks read the real headers
    ln -s "$real_cuda/lib64" "$stubs/lib64"
    {
      echo '#!/bin/bash'
      echo 'if [ "$1" = --version ]; then echo "Cuda compilation tools, release 13.0"; exit 0; fi'
      echo 'out=""; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done'
      echo 'printf "#!/bin/bash\necho \"cuda:0 stub GPU, sm_90, 139.8 GiB\"\n" >"$out"'
      echo 'chmod +x "$out"'
    } >"$stubs/bin/nvcc"
    {
      echo '#!/bin/bash'
      echo 'if [ "$1" = --build ]; then'
      echo '  mkdir -p "$2/bin" "$2/tests/kernels"'
      echo '  for f in bin/meshrt bin/meshrt-bench-gemm tests/kernels/test_kernels; do'
      echo '    printf "#!/bin/bash\necho stub \$0 \"\$*\"\n" >"$2/$f"; chmod +x "$2/$f"'
      echo '  done'
      echo '  exit 0'
      echo 'fi'
      echo 'while [ $# -gt 0 ]; do'
      echo '  [ "$1" = -B ] && mkdir -p "$2" && touch "$2/CMakeCache.txt"; shift'
      echo 'done'
    } >"$stubs/bin/cmake"
    printf '#!/bin/bash\necho "100%% tests passed, 0 tests failed out of 1"\n' >"$stubs/bin/ctest"
    printf '#!/bin/bash\n[ "$1" = stats ] && echo L0.attn.fwd\nexit 0\n' >"$stubs/bin/nsys"
    printf '#!/bin/bash\necho "stub sanitizer $*"\nexit ${STUB_SANITIZER_RC:-0}\n' \
      >"$stubs/bin/compute-sanitizer"
    chmod +x "$stubs/bin/nvcc" "$stubs/bin/cmake" "$stubs/bin/ctest" "$stubs/bin/nsys" \
      "$stubs/bin/compute-sanitizer"
    run_stubbed() {
      rm -rf "${tmp:?}/out" "${tmp:?}/build"
      PATH=$stubs/bin:$PATH CUDA_HOME=$stubs MESHRT_GPU_BUILD=$tmp/build OUT=$tmp/out "$script" \
        >"$tmp/stdout" 2>&1
    }
    run_stubbed
    rc=$?
    if [ $rc -eq 2 ]; then
      echo "SKIPPED: this machine lacks gpu-check's prerequisites:"
      grep MISSING "$tmp/out/summary.txt"
      exit 77
    fi
    [ $rc -eq 0 ] || fail "stubbed run: exit $rc, expected 0"
    for s in "probe build" "configure (attempt 1)" build "meshrt info" "ctest -L cuda" \
      "compute-sanitizer memcheck" "compute-sanitizer racecheck" "bench gemm cuda bf16" \
      "bench gemm cuda f32" "bench block cuda" "nsys nvtx" "nsys stats"; do
      grep -qF "] $s: ok (" "$tmp/out/summary.txt" || fail "step '$s' not ok"
    done
    grep -q -- "--tool racecheck .*test_kernels \[sanitize\]" "$tmp/out/sanitizer-racecheck.log" ||
      fail "racecheck did not run test_kernels [sanitize]"
    STUB_SANITIZER_RC=1 run_stubbed
    rc=$?
    [ $rc -eq 1 ] || fail "failing sanitizer: exit $rc, expected 1"
    grep -q "compute-sanitizer memcheck: FAILED" "$tmp/out/summary.txt" || fail "no FAILED line"
    if ! command -v compute-sanitizer >/dev/null 2>&1; then
      rm "$stubs/bin/compute-sanitizer"
      run_stubbed
      rc=$?
      [ $rc -eq 0 ] || fail "without compute-sanitizer: exit $rc, expected 0"
      grep -q "compute-sanitizer racecheck: SKIPPED" "$tmp/out/summary.txt" ||
        fail "missing compute-sanitizer not logged as SKIPPED"
    fi
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
