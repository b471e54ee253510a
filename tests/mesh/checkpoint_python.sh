#!/bin/sh
# The standard `safetensors` Python package reads meshrt checkpoints: every rank file loads,
# shapes and CRC-32C match the index, and the full tensors rebuilt from the tp=2 shards equal
# those of a tp=1 checkpoint of the same run (--lr 0: parameters stay the Philox initial values,
# equal bit for bit on every layout; the moments hold the gradients, equal within f32 tolerance). Uses the venv tools/install-deps.sh makes.
# Usage: checkpoint_python.sh <meshrt> <source dir>; exits 77 (skip) only when pip cannot reach
# the package index.
set -eu
meshrt="$1"
src="$2"
py="$src/.venv-ci/bin/python"
if ! "$py" -c "import safetensors, numpy" 2>/dev/null; then
  if ! "$src/tools/install-deps.sh" --python-venv; then
    echo "SKIP: cannot install safetensors and numpy into $src/.venv-ci (pip has no network?)"
    exit 77
  fi
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/meshrt_ckpt_py.XXXXXX")
trap 'rm -rf "$dir"' EXIT
args="train --hidden 64 --heads 4 --seq 16 --vocab 130 --ffn 90 --batch 4 --steps 2 --lr 0"
"$meshrt" $args --devices cpu:2 --mesh tp=2 --save "$dir/tp2" >/dev/null
"$meshrt" $args --devices cpu:1 --save "$dir/tp1" >/dev/null
"$py" - "$dir" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file

def crc32c(data):
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ table[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF

def full_tensors(root):
    d = root + "/" + open(root + "/latest").read().strip()
    idx = json.load(open(d + "/index.json"))
    assert idx["format"] == "meshrt-checkpoint", idx["format"]
    files = {}
    for name, f in idx["files"].items():
        raw = open(d + "/" + name, "rb").read()
        assert len(raw) == f["bytes"], name
        assert "%08x" % crc32c(raw) == f["crc32c"], name
        files[name] = load_file(d + "/" + name)
        assert int(files[name]["optimizer.step"][0]) == idx["optimizer"]["step"] == 2
    out = {}
    for name, t in idx["tensors"].items():
        full = np.full(t["shape"], np.nan, dtype=np.float32)
        for s in t["shards"]:
            part = files[s["file"]][name]
            assert list(part.shape) == s["shape"], (name, part.shape, s["shape"])
            sl = tuple(slice(o, o + n) for o, n in zip(s["offsets"], s["shape"]))
            full[sl] = part
        assert not np.isnan(full).any(), name + " not covered by its shards"
        out[name] = full
    return out

a, b = full_tensors(sys.argv[1] + "/tp2"), full_tensors(sys.argv[1] + "/tp1")
assert a.keys() == b.keys() and len(a) > 10
params = [k for k in a if not k.endswith(("exp_avg", "exp_avg_sq"))]
assert len(params) * 3 == len(a)
for k in params:
    assert np.array_equal(a[k], b[k]), k + " differs between the tp=2 and tp=1 checkpoints"
worst = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-30))
            for k in a if k not in params)
print("tensors: %d; parameters bit-identical tp=2 vs tp=1; moments max rel diff %.2e"
      % (len(a), worst))
assert worst < 1e-4, worst
print("embed.weight[0,:4] =", a["embed.weight"][0, :4])
PY
