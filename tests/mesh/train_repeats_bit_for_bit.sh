#!/bin/sh
# Issue 51 item 14: the same `meshrt train` command run twice writes the same parameters and
# optimizer state, bit for bit. The model's GEMM panels reach 2^22 multiply-adds, where
# MESHRT_HOST_F32_GEMM=auto's table gives them to oneDNN on AVX-512 CPUs; and the two f32 paths,
# forced, give different bits here (in a build with oneDNN), so a choice that could change between
# two runs (auto used to time both paths at a shape's first use) would change the results.
# Usage: train_repeats_bit_for_bit.sh <meshrt>
set -eu
meshrt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args="train --devices cpu --steps 2 --layers 1 --hidden 256 --heads 4 --seq 64 --batch 8 --vocab 256"

# run <name> [VAR=value...]: the command under that environment, its checkpoint in $work/<name>.
run() {
  name=$1
  shift
  if ! env "$@" "$meshrt" $args --save "$work/$name" >"$work/$name.txt" 2>&1; then
    cat "$work/$name.txt"
    exit 1
  fi
}
# procs <name>: the command as 2 processes (dp=2, file rendezvous, the shm backend), its
# checkpoint in $work/<name>.
procs() {
  name=$1
  mkdir -p "$work/rdv-$name"
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 MESHRT_RENDEZVOUS="file://$work/rdv-$name" "$meshrt" $args --mesh dp=2 \
      --save "$work/$name" >"$work/$name-$r.txt" 2>&1 &
    eval "pid$r=\$!"
  done
  rc=0
  wait "$pid0" || rc=1
  wait "$pid1" || rc=1
  if [ $rc -ne 0 ]; then
    cat "$work/$name-0.txt" "$work/$name-1.txt"
    exit 1
  fi
}
# same <a> <b>: the two checkpoints hold the same tensor files, byte for byte.
same() {
  fa=$(cd "$work/$1" && find . -name '*.safetensors' | sort)
  fb=$(cd "$work/$2" && find . -name '*.safetensors' | sort)
  [ -n "$fa" ] && [ "$fa" = "$fb" ] || { echo "checkpoint files differ: [$fa] [$fb]"; return 1; }
  for f in $fa; do cmp -s "$work/$1/$f" "$work/$2/$f" || return 1; done
}

run first
run second
"$meshrt" info | grep gemm32 || true
if ! same first second; then
  echo "FAIL: the same train command twice wrote different parameters"
  exit 1
fi
echo "the same command twice: the same parameters, bit for bit"
procs procs1
procs procs2
if ! same procs1 procs2; then
  echo "FAIL: the same 2-process train command twice wrote different parameters"
  exit 1
fi
echo "the same 2-process command (shm) twice: the same parameters, bit for bit"
if "$meshrt" info | grep gemm32 | grep -q "built without oneDNN"; then
  echo "no oneDNN in this build: one f32 path only"
  exit 0
fi
run blas MESHRT_HOST_F32_GEMM=openblas
run dnnl MESHRT_HOST_F32_GEMM=onednn
if same blas dnnl; then
  echo "FAIL: OpenBLAS and oneDNN gave the same bits: this run does not show the paths apart"
  exit 1
fi
echo "OpenBLAS and oneDNN, forced: different bits (a per-run choice would show)"
grep '^step' "$work/blas.txt" "$work/dnnl.txt" || true
