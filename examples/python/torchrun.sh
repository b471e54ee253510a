#!/bin/sh
# The Python examples as torchrun runs them, one process per rank: allreduce_processes.py and
# attn_torch.py under `torchrun --standalone --nproc-per-node 2`, and attn_torch.py --processes
# (2 processes started with torchrun's variables by the script itself).
# Python with PyTorch: MESHRT_TORCH_PYTHON, else <repo>/.venv-torch, else <repo>/.venv-ci;
# exits 77 (skipped), saying why, when none has torch and numpy.
# Usage: torchrun.sh <repo root> <path to libmeshrt.so>
root="$1"
lib="$2"
here="$(cd "$(dirname "$0")" && pwd)"
py=""
for cand in "${MESHRT_TORCH_PYTHON:-}" "$root/.venv-torch/bin/python" "$root/.venv-ci/bin/python"; do
  if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c "import torch, numpy" 2>/dev/null; then
    py="$cand"
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIPPED: no python with torch and numpy (set MESHRT_TORCH_PYTHON, or make <repo>/.venv-torch: python3 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy)"
  exit 77
fi
status=0
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
run "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$here/allreduce_processes.py" "$lib"
run "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$here/attn_torch.py" "$lib"
run "$py" "$here/attn_torch.py" "$lib" --processes
[ $status -eq 0 ] && echo "OK"
exit $status
