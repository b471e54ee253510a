#!/usr/bin/env bash
# One run on a GPU machine does all the GPU checking: builds the CUDA configuration, runs every
# ctest case labelled `cuda`, the kernel benchmark (GPU, plus the host for reference), the block
# benchmark on one GPU (and its NVTX ranges under nsys when installed), and
# writes logs and figures to a results folder. Budget: about 10 minutes on one H200 (the build is
# most of it; the step limits below add up to more, as a safety net, not as the expectation).
#
# Usage: tools/gpu-check.sh [RESULTS_DIR]     (default: $OUT, else bench/results/gpu)
# Env:   MESHRT_GPU_BUILD  build folder (default build-gpu)
#        CUDA_ARCH         CMAKE_CUDA_ARCHITECTURES (default 90)
# Exit:  0 when the build, every cuda test and the benchmarks succeeded; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RES=${1:-${OUT:-$ROOT/bench/results/gpu}}
BUILD=${MESHRT_GPU_BUILD:-$ROOT/build-gpu}
ARCH=${CUDA_ARCH:-90}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
start=$(date +%s)
status=0
: >"$RES/summary.txt"
log() { echo "[gpu-check +$(($(date +%s) - start))s] $*" | tee -a "$RES/summary.txt"; }
# Runs "$@" with a time limit, output to a log file; records the outcome in the summary.
step() {
  local name=$1 limit=$2 logf=$3
  shift 3
  local t0=$(date +%s) rc
  timeout --kill-after=10 "$limit" "$@" >"$logf" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    log "$name: ok ($(($(date +%s) - t0)) s)"
  else
    [ $rc -eq 124 ] && log "$name: TIMED OUT after ${limit}s (log: $(basename "$logf"))" ||
      log "$name: FAILED rc=$rc (log: $(basename "$logf"))"
    status=1
  fi
  return $rc
}

log "results in $RES; build in $BUILD; $JOBS jobs"
{ nvidia-smi || echo "nvidia-smi not available"; } >"$RES/nvidia-smi.txt" 2>&1
head -n 12 "$RES/nvidia-smi.txt" | sed 's/^/  /'

# ---- configure ------------------------------------------------------------------------------
cfg=(-S . -B "$BUILD" -DMESHRT_CUDA=ON -DMESHRT_WERROR=ON -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
if ! step configure 180 "$RES/configure.log" cmake "${cfg[@]}"; then
  # CMake < 3.26 cannot try-compile nvcc at CUDA_STANDARD 20 during enable_language(CUDA);
  # skipping that probe still compiles every file with -std=c++20.
  log "retrying configure with CMAKE_CUDA_COMPILER_FORCED=ON in a fresh build folder"
  rm -rf "$BUILD"
  status=0
  step configure-forced 180 "$RES/configure.log" cmake "${cfg[@]}" -DCMAKE_CUDA_COMPILER_FORCED=ON ||
    { log "cannot configure; giving up"; exit 1; }
fi

# ---- build (every .cu with -Werror) ---------------------------------------------------------
if ! step build 420 "$RES/build.log" cmake --build "$BUILD" -j "$JOBS"; then
  grep -E "error|Error" "$RES/build.log" | head -n 30 | sed 's/^/  /'
  log "build failed; giving up"
  exit 1
fi

# ---- tests labelled cuda --------------------------------------------------------------------
step "ctest -L cuda" 240 "$RES/ctest-cuda.log" \
  ctest --test-dir "$BUILD" -L cuda --output-on-failure --timeout 150 -j 4 \
  --output-junit "$RES/ctest-cuda.xml"
grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*" "$RES/ctest-cuda.log" | tail -n 25 |
  sed 's/^/  /'

# ---- kernel benchmark -----------------------------------------------------------------------
BENCH="$BUILD/bin/meshrt-bench-gemm"
step "bench gemm cuda bf16" 150 "$RES/bench-gemm-cuda-bf16.txt" \
  "$BENCH" --devices cuda:0 --dtype bf16 --json "$RES/bench-gemm-cuda-bf16.json"
step "bench gemm cuda f32" 120 "$RES/bench-gemm-cuda-f32.txt" \
  "$BENCH" --devices cuda:0 --dtype f32 --no-attention --json "$RES/bench-gemm-cuda-f32.json"
# The host figures on this machine's CPUs, for reference. When OpenBLAS's table does not know
# this CPU, the bench's header says which OPENBLAS_CORETYPE to use: take its advice.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$("$BENCH" --devices cpu --no-gemm --no-elementwise --no-attention 2>/dev/null |
    sed -n 's/.*OPENBLAS_CORETYPE=\([A-Za-z0-9]*\).*/\1/p' | head -n 1)
  if [ -n "$core" ]; then
    export OPENBLAS_CORETYPE=$core
    log "OpenBLAS does not know this CPU: running the host bench with OPENBLAS_CORETYPE=$core"
  fi
fi
step "bench gemm cpu f32" 150 "$RES/bench-gemm-cpu-f32.txt" \
  "$BENCH" --devices cpu --dtype f32 --repeats 5 --json "$RES/bench-gemm-cpu-f32.json"

# ---- block benchmark on one GPU (its CUDA defaults: hidden 4096, seq 2048, batch 4, bf16) ----
MESHRT="$BUILD/bin/meshrt"
step "bench block cuda" 120 "$RES/bench-block-cuda.txt" \
  "$MESHRT" bench block --devices cuda:0 --json "$RES/bench-block-cuda.json" \
  --trace "$RES/bench-block-cuda-trace.json"
# NVTX ranges under Nsight Systems, when it is installed: every piece and collective is a range
# in the meshrt domain.
if command -v nsys >/dev/null 2>&1; then
  rm -f "$RES"/nvtx-sum.txt "$RES"/block-nvtx.nsys-rep "$RES"/block-nvtx.sqlite
  step "nsys nvtx" 120 "$RES/nsys.log" \
    nsys profile -t cuda,nvtx -o "$RES/block-nvtx" --force-overwrite true \
    "$MESHRT" bench block --devices cuda:0 --steps 3 --warmup 1 --no-calibrate &&
    step "nsys stats" 60 "$RES/nvtx-sum.txt" \
      nsys stats --force-export=true --report nvtx_sum "$RES/block-nvtx.nsys-rep"
  if grep -qF "L0.attn.fwd" "$RES/nvtx-sum.txt" 2>/dev/null; then
    log "nvtx: meshrt ranges present (nvtx-sum.txt)"
  else
    log "nvtx: L0.attn.fwd range NOT found in nvtx-sum.txt"
    status=1
  fi
else
  log "nvtx: nsys not installed; ranges not checked"
fi
for f in "$RES"/bench-gemm-*.txt "$RES"/bench-block-*.txt; do
  echo "== $(basename "$f")"
  cat "$f"
done >"$RES/bench-all.txt"
sed 's/^/  /' "$RES/bench-all.txt"

log "done in $(($(date +%s) - start)) s, status $status"
exit $status
