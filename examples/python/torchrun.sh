#!/bin/sh
# The Python examples as torchrun runs them, one process per rank: allreduce_processes.py and
# attn_torch.py under `torchrun --standalone --nproc_per_node 2`, attn_torch.py --processes
# (2 processes started with torchrun's variables by the script itself), and, given the meshrt
# binary, `meshrt train --devices cpu` under torchrun (--no_python), whose losses must equal the
# same training as 2 threads of one process.
# Python with PyTorch: MESHRT_TORCH_PYTHON, else <repo>/.venv-torch, else <repo>/.venv-ci, else
# the system's python3 (Debian's python3-torch); exits 77 (skipped), saying why, when none has
# torch and numpy.
# Usage: torchrun.sh <repo root> <path to libmeshrt.so> [<path to the meshrt binary>]
root="$1"
lib="$2"
meshrt="${3:-}"
case "$meshrt" in "" | /*) ;; *) meshrt="$PWD/$meshrt" ;; esac
here="$(cd "$(dirname "$0")" && pwd)"
py=""
for cand in "${MESHRT_TORCH_PYTHON:-}" "$root/.venv-torch/bin/python" "$root/.venv-ci/bin/python" \
  /usr/bin/python3; do
  if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c "import torch, numpy" 2>/dev/null; then
    py="$cand"
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIPPED: no python with torch and numpy (set MESHRT_TORCH_PYTHON, or apt-get install python3-torch, or make <repo>/.venv-torch: python3 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy)"
  exit 77
fi
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
# torch < 2 on Python >= 3.11 (Debian 12's python3-torch 1.13) cannot parse its own default
# `--redirects 0` / `--tee 0` (Python 3.11 no longer iterates an IntFlag's zero member): give a
# mapping that names no local rank, which means the same (nothing redirected).
compat=""
if "$py" -c 'import sys, torch; sys.exit(0 if sys.version_info >= (3, 11) and int(torch.__version__.split(".")[0]) < 2 else 1)'; then
  compat="--redirects 9:0 --tee 9:0"
fi
scratch="$(mktemp -d "${TMPDIR:-/tmp}/meshrt-torchrun.XXXXXX")" || exit 1
trap 'rm -rf "$scratch"' EXIT
status=0
out=""
run() {
  echo "\$ $*"
  out="$("$@" 2>&1)"
  rc=$?
  echo "$out"
  if [ $rc -ne 0 ]; then
    echo "FAILED (exit status $rc): $*"
    status=1
  fi
}
# torchrun is torch.distributed.run; its agent's store is MASTER_PORT, meshrt listens on + 1.
# shellcheck disable=SC2086  # $compat is empty or whole words
run "$py" -m torch.distributed.run $compat --standalone --nproc_per_node 2 "$here/allreduce_processes.py" "$lib"
# shellcheck disable=SC2086
run "$py" -m torch.distributed.run $compat --standalone --nproc_per_node 2 "$here/attn_torch.py" "$lib"
run "$py" "$here/attn_torch.py" "$lib" --processes
if [ -n "$meshrt" ]; then
  # The CLI under torchrun: each process one rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
  # dp = 2 over the shm backend. Its per-step losses against 2 threads of one process.
  cd "$scratch" || exit 1
  # shellcheck disable=SC2086
  run "$py" -m torch.distributed.run $compat --standalone --nproc_per_node 2 --no_python \
    "$meshrt" train --devices cpu --steps 4
  procs="$out"
  run "$meshrt" train --devices cpu:2 --steps 4
  threads="$out"
  # Step lines of rank 0 (torchrun passes the ranks' output through; only rank 0 prints steps).
  printf '%s\n' "$procs" | grep '^step ' >"$scratch/procs"
  printf '%s\n' "$threads" | grep '^step ' >"$scratch/threads"
  if "$py" - "$scratch/procs" "$scratch/threads" <<'EOF'; then
import sys
def losses(path):
    return [float(line.split()[3]) for line in open(path) if line.startswith("step ")]
p, t = losses(sys.argv[1]), losses(sys.argv[2])
ok = len(p) == 4 and len(t) == 4 and all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(p, t))
print("train losses, torchrun processes:", p)
print("train losses, 2 threads:         ", t)
print("equal to 1e-5:", ok)
sys.exit(0 if ok else 1)
EOF
    :
  else
    echo "FAILED: meshrt train under torchrun does not match 2 threads"
    status=1
  fi
fi
[ $status -eq 0 ] && echo "OK"
exit $status
