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
