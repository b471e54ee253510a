#!/usr/bin/env bash
# One run on a GPU machine does all the GPU checking, within one device call (about 10 minutes):
# checks the prerequisites, probes the GPU (and stops at once, saying why, when none is usable),
# builds the CUDA configuration, runs every ctest case labelled `cuda` (one at a time: GPUs in
# exclusive-process mode take one process each), the kernels' small [sanitize] cases under
# compute-sanitizer memcheck and racecheck when it is installed, the CUDA kernel and block
# benchmarks (no CPU benchmark) and the block's NVTX ranges under nsys when installed. Everything
# lands in the results folder: summary.txt, one log per step (each configure attempt its own),
# bench JSON.
#
# Usage: tools/gpu-check.sh [RESULTS_DIR]     (default: $OUT, else bench/results/data/gpu)
# Env:   MESHRT_GPU_BUILD     build folder (default build-gpu)
#        MESHRT_GPU_DEADLINE  seconds for the whole run (default 540); each step may use its
#                             share of it plus what the steps before it left unused
#        MESHRT_GPU_CHECK_STOP=probe  stop after the prerequisites and the GPU probe
#        CUDA_ARCH            CMAKE_CUDA_ARCHITECTURES (default 90)
#        CUDA_HOME            CUDA toolkit used when nvcc is not on PATH (default /usr/local/cuda)
# Exit:  0 everything ran and passed (compute-sanitizer or nsys missing: their steps are logged
#        as skipped); 1 a step failed, timed out or was cut by the deadline, or a cuda test was
#        skipped on the GPU machine; 2 a prerequisite is missing; 3 no usable GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RES=${1:-${OUT:-$ROOT/bench/results/data/gpu}}
BUILD=${MESHRT_GPU_BUILD:-$ROOT/build-gpu}
ARCH=${CUDA_ARCH:-90}
DEADLINE=${MESHRT_GPU_DEADLINE:-540}
STOP=${MESHRT_GPU_CHECK_STOP:-}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$RES" "$BUILD" || exit 1
RES=$(cd "$RES" && pwd)
BUILD=$(cd "$BUILD" && pwd)
start=$(date +%s)
status=0
: >"$RES/summary.txt"
log() { echo "[gpu-check +$(($(date +%s) - start))s] $*" | tee -a "$RES/summary.txt"; }
left() { echo $((start + DEADLINE - $(date +%s))); }
finish() {
  log "done in $(($(date +%s) - start)) s of ${DEADLINE} s, exit $1"
  exit "$1"
}

# Step budgets, percent of the deadline, in the order the steps run; they add up to 100
# (SHARES_TOTAL, checked below). A step may run until the end of its budget counted from the
# start (its share plus those before it), so it gets whatever earlier steps left unused, and at
# least its own share (the prerequisite checks, outside any budget, or an earlier step running
# long do not starve it); the deadline cuts everything. The configure retry runs within
# configure's budget. What a step takes on one H200 (16 cores) is an estimate until
# the first run's summary shows it: probe build ~3 s, configure ~15 s, build (every .cu with
# -Werror, Ninja, no ccache) 120-240 s, ctest -L cuda 60-100 s, each sanitizer pass 15-30 s,
# the benchmarks ~10-20 s each, nsys ~15 s.
declare -A SHARE=(
  [probe]=4 [configure]=5 [build]=40 [info]=2 [ctest]=20 [memcheck]=7 [racecheck]=8
  [bench_bf16]=4 [bench_f32]=2 [bench_block]=4 [nsys]=3 [nsys_stats]=1
)
SHARES_TOTAL=0
for k in "${!SHARE[@]}"; do SHARES_TOTAL=$((SHARES_TOTAL + SHARE[$k])); done
budget_end=0 # percent of the deadline the current step may run to
counted=""   # the budget last added to budget_end

# Adds budget $1's share to budget_end, once (the configure retry shares attempt 1's budget).
take_budget() {
  if [ "$1" != "$counted" ]; then
    budget_end=$((budget_end + SHARE[$1]))
    counted=$1
  fi
}

# Runs "$@" until the end of the budget named $2 (budget_end) or for that budget's share,
# whichever is longer, cut to the time left keeping 10 s to write the summary; output to a log
# file; records the outcome in the summary.
step() {
  local name=$1 budget=$2 logf=$3
  take_budget "$budget"
  shift 3
  local limit remain own
  limit=$((start + DEADLINE * budget_end / 100 - $(date +%s)))
  own=$((DEADLINE * SHARE[$budget] / 100))
  [ "$limit" -lt "$own" ] && limit=$own
  remain=$(($(left) - 10))
  [ "$limit" -gt "$remain" ] && limit=$remain
  if [ "$limit" -lt 5 ]; then
    log "$name: NOT RUN, the ${DEADLINE} s deadline is reached"
    status=1
    return 124
  fi
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$logf" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    log "$name: ok ($(($(date +%s) - t0)) s of ${limit} s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    log "$name: TIMED OUT after ${limit} s (log: $(basename "$logf"))"
    status=1
  else
    log "$name: FAILED rc=$rc (log: $(basename "$logf"))"
    status=1
  fi
  return $rc
}

log "results in $RES; build in $BUILD; $JOBS jobs; deadline ${DEADLINE} s"
if [ "$SHARES_TOTAL" -ne 100 ]; then
  log "step shares add up to ${SHARES_TOTAL}%, not 100%: fix SHARE in $0"
  finish 1
fi

# ---- prerequisites: every tool, header and library the CUDA build needs -----------------------
NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  NVCC=$CUDA_HOME/bin/nvcc
  export PATH=$CUDA_HOME/bin:$PATH # CMake looks for nvcc on PATH
fi
[ -n "$NVCC" ] && CUDA_HOME=$(dirname "$(dirname "$NVCC")")
CXX_BIN=$(command -v "${CXX:-c++}" || command -v g++ || true)
missing=()
need_tool() { command -v "$1" >/dev/null 2>&1 || missing+=("$1 ($2)"); }
[ -n "$NVCC" ] || missing+=("nvcc (CUDA toolkit: not on PATH nor in $CUDA_HOME/bin)")
need_tool cmake "cmake >= 3.24"
[ -n "$CXX_BIN" ] || missing+=("a C++ compiler (build-essential)")
need_tool mpiexec "openmpi-bin"
need_header() {
  [ -n "$CXX_BIN" ] || return
  echo "#include <$1>" | "$CXX_BIN" -E -x c++ -std=c++20 -I"$CUDA_HOME/include" \
    -I/usr/include/x86_64-linux-gnu -I/usr/include/openblas $(mpicc --showme:compile 2>/dev/null) \
    - >/dev/null 2>&1 || missing+=("$1 ($2)")
}
need_header cuda_runtime_api.h "CUDA toolkit headers"
need_header cublasLt.h "libcublas-dev"
need_header nccl.h "libnccl-dev"
need_header nvtx3/nvToolsExt.h "CUDA toolkit NVTX headers"
need_header cblas.h "libopenblas-dev"
need_header mpi.h "libopenmpi-dev"
need_header catch2/catch.hpp "catch2"
need_header spdlog/spdlog.h "libspdlog-dev"
need_header fmt/core.h "libfmt-dev"
need_header nlohmann/json.hpp "nlohmann-json3-dev"
need_header CLI/CLI.hpp "libcli11-dev"
# A library is found when any of these globs matches (ls of them all fails when one does not), or
# ldconfig knows it; grep reads ldconfig's whole output (grep -q would quit at the first match and
# SIGPIPE ldconfig, which pipefail reports as a failure).
need_lib() {
  local g
  for g in "$CUDA_HOME"/lib64/lib"$1".so* /usr/lib/*-linux-gnu/lib"$1".so* \
    /usr/lib64/lib"$1".so* /usr/local/lib/lib"$1".so*; do
    [ -e "$g" ] && return
  done
  ldconfig -p 2>/dev/null | grep "lib$1\.so" >/dev/null || missing+=("lib$1.so ($2)")
}
need_lib cudart "CUDA runtime"
need_lib cublasLt "libcublas"
need_lib cublas "libcublas"
need_lib nccl "libnccl2"
need_lib openblas "libopenblas-dev"
if [ ${#missing[@]} -gt 0 ]; then
  log "MISSING PREREQUISITES: ${missing[*]}"
  log "install them (tools/install-deps.sh for the Debian packages) and rerun"
  finish 2
fi
log "prerequisites: ok (nvcc $NVCC, $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
# compute-sanitizer is optional: without it the memcheck / racecheck steps are logged as SKIPPED
# and the rest of the check (build, tests, benchmarks) still runs, rather than spending a rare
# GPU window on a prerequisite failure. It ships in the toolkit's bin/ or compute-sanitizer/.
SANITIZER=$(command -v compute-sanitizer || true)
for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
if [ -n "$SANITIZER" ]; then
  log "compute-sanitizer: $SANITIZER"
else
  log "compute-sanitizer: not found (PATH, $CUDA_HOME/bin, $CUDA_HOME/compute-sanitizer);" \
    "memcheck and racecheck will be SKIPPED"
fi

# ---- GPU probe: a GPU the CUDA runtime can use, before spending minutes on the build ----------
{ nvidia-smi || echo "nvidia-smi not available"; } >"$RES/nvidia-smi.txt" 2>&1
head -n 12 "$RES/nvidia-smi.txt" | sed 's/^/  /'
mkdir -p "$BUILD/gpu-probe"
cat >"$BUILD/gpu-probe/probe.cu" <<'EOF'
#include <cuda_runtime_api.h>
#include <cstdio>
int main() {
  int drv = 0, rt = 0, n = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  const cudaError_t e = cudaGetDeviceCount(&n);
  std::printf("driver supports CUDA %d.%d, runtime is CUDA %d.%d\n", drv / 1000, drv % 1000 / 10,
              rt / 1000, rt % 1000 / 10);
  if (e != cudaSuccess || n == 0) {
    std::printf("no usable CUDA device: %s (%s)\n",
                e == cudaSuccess ? "no device" : cudaGetErrorString(e),
                drv == 0 ? "no CUDA driver loaded" : drv < rt ? "driver older than the runtime" : "");
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    std::printf("cuda:%d %s, sm_%d%d, %.1f GiB\n", i, p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0);
  }
  return 0;
}
EOF
if ! step "probe build" probe "$RES/probe-build.log" \
  "$NVCC" -o "$BUILD/gpu-probe/probe" "$BUILD/gpu-probe/probe.cu"; then
  finish 1
fi
if ! timeout 30 "$BUILD/gpu-probe/probe" >"$RES/probe.txt" 2>&1; then
  log "NO USABLE GPU: $(tail -n 2 "$RES/probe.txt" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
  finish 3
fi
log "probe: $(tr '\n' ';' <"$RES/probe.txt" | sed 's/;$//')"
GPUS=$(grep -c '^cuda:' "$RES/probe.txt")
[ "$STOP" = probe ] && finish 0

# ---- configure (each attempt keeps its log) ---------------------------------------------------
gen=()
if command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
# A build folder made by another generator cannot be reused.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  want=$([ ${#gen[@]} -gt 0 ] && echo Ninja || echo "Unix Makefiles")
  grep -q "^CMAKE_GENERATOR:INTERNAL=$want\$" "$BUILD/CMakeCache.txt" ||
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
fi
cfg=(-S . -B "$BUILD" "${gen[@]}" -DMESHRT_CUDA=ON -DMESHRT_WERROR=ON
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
if ! step "configure (attempt 1)" configure "$RES/configure-1.log" cmake "${cfg[@]}"; then
  # CMake < 3.26 cannot try-compile nvcc at CUDA_STANDARD 20 during enable_language(CUDA);
  # skipping that probe still compiles every file with -std=c++20.
  log "retrying configure with CMAKE_CUDA_COMPILER_FORCED=ON in a fresh build folder"
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  status=0
  step "configure (attempt 2, forced)" configure "$RES/configure-2.log" \
    cmake "${cfg[@]}" -DCMAKE_CUDA_COMPILER_FORCED=ON || finish 1
fi

# ---- build (every .cu with -Werror) -----------------------------------------------------------
if ! step build build "$RES/build.log" cmake --build "$BUILD" -j "$JOBS"; then
  grep -E "error|Error" "$RES/build.log" | head -n 30 | sed 's/^/  /'
  finish 1
fi

# ---- what meshrt itself sees ------------------------------------------------------------------
MESHRT="$BUILD/bin/meshrt"
step "meshrt info" info "$RES/meshrt-info.txt" "$MESHRT" info || finish 1
if grep -q "cuda *unavailable" "$RES/meshrt-info.txt"; then
  log "NO USABLE GPU (meshrt info): $(sed -n 's/.*cuda *unavailable: //p' "$RES/meshrt-info.txt")"
  finish 3
fi

# ---- tests labelled cuda, one at a time -------------------------------------------------------
step "ctest -L cuda" ctest "$RES/ctest-cuda.log" \
  ctest --test-dir "$BUILD" -L cuda -j 1 --output-on-failure --timeout 150 \
  --output-junit "$RES/ctest-cuda.xml"
grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*" "$RES/ctest-cuda.log" | tail -n 25 |
  sed 's/^/  /'
# A skipped cuda test on a GPU machine checked nothing: only cases needing more GPUs than
# there are may skip.
while IFS= read -r t; do
  [ -n "$t" ] || continue
  if [ "$GPUS" -lt 2 ] && case $t in *split*) true ;; *) false ;; esac; then
    log "skipped (needs two GPUs, $GPUS here): $t"
  else
    log "SKIPPED ON A GPU MACHINE: $t"
    status=1
  fi
done < <(sed -n 's/.*Test *#[0-9]*: \(.*[^ .]\) *\.* *\*\*\*Skipped.*/\1/p' "$RES/ctest-cuda.log")

# ---- compute-sanitizer over the kernels' [sanitize] cases --------------------------------------
# test_kernels' cases tagged [sanitize]: attention (flash and reference, bf16 / f16, head_dim 64 /
# 128, shapes reaching every tile edge and the mask: attention_cases.h's sanitize_cases; the
# context-parallel blocks with document masks: test_cuda_attention_block.cpp), norms,
# softmax / cross-entropy and elementwise. memcheck: out-of-bounds and misaligned accesses and
# every failed CUDA call; racecheck: shared-memory hazards (a missing or misplaced __syncthreads
# in the tiled kernels). Limits: meshrt's caching allocator rounds each cudaMalloc up by at most
# 25%, so memcheck sees a read past a tensor's end only beyond that rounding, and reused blocks
# are never uninitialised to it.
KT="$BUILD/tests/kernels/test_kernels"
for tool in memcheck racecheck; do
  if [ -z "$SANITIZER" ]; then
    take_budget "$tool" # its budget passes to the steps after it
    log "compute-sanitizer $tool: SKIPPED (compute-sanitizer not installed)"
    continue
  fi
  step "compute-sanitizer $tool" "$tool" "$RES/sanitizer-$tool.log" \
    "$SANITIZER" --tool "$tool" --error-exitcode 1 --print-limit 50 \
    "$KT" "[sanitize]" --warn NoTests --order decl
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid|All tests passed|test cases" \
    "$RES/sanitizer-$tool.log" | tail -n 6 | sed 's/^/  /'
done

# ---- benchmarks on the GPU (JSON next to the summary) -----------------------------------------
BENCH="$BUILD/bin/meshrt-bench-gemm"
step "bench gemm cuda bf16" bench_bf16 "$RES/bench-gemm-cuda-bf16.txt" \
  "$BENCH" --devices cuda:0 --dtype bf16 --json "$RES/bench-gemm-cuda-bf16.json"
step "bench gemm cuda f32" bench_f32 "$RES/bench-gemm-cuda-f32.txt" \
  "$BENCH" --devices cuda:0 --dtype f32 --no-attention --json "$RES/bench-gemm-cuda-f32.json"
# One GPU, its CUDA defaults: hidden 4096, seq 2048, batch 4, bf16.
step "bench block cuda" bench_block "$RES/bench-block-cuda.txt" \
  "$MESHRT" bench block --devices cuda:0 --json "$RES/bench-block-cuda.json" \
  --trace "$RES/bench-block-cuda-trace.json"
# NVTX ranges under Nsight Systems, when it is installed: every piece and collective is a range
# in the meshrt domain.
if command -v nsys >/dev/null 2>&1; then
  rm -f "$RES"/nvtx-sum.txt "$RES"/block-nvtx.nsys-rep "$RES"/block-nvtx.sqlite
  step "nsys nvtx" nsys "$RES/nsys.log" \
    nsys profile -t cuda,nvtx -o "$RES/block-nvtx" --force-overwrite true \
    "$MESHRT" bench block --devices cuda:0 --steps 3 --warmup 1 --no-calibrate &&
    step "nsys stats" nsys_stats "$RES/nvtx-sum.txt" \
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
  [ -f "$f" ] || continue
  echo "== $(basename "$f")"
  cat "$f"
done >"$RES/bench-all.txt"
sed 's/^/  /' "$RES/bench-all.txt"
finish $status
