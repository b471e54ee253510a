#!/usr/bin/env bash
# Installs, only when missing, the Debian packages meshrt's build, tests and benches need.
# Idempotent and quiet when nothing is missing. Run as root (or with sudo available).
# Also makes (or reuses) the Python venv .venv-ci at the repository root with safetensors and
# numpy, which the checkpoint test reads files with, and lizard, which lint.function_length
# measures function lengths with (Debian's python is externally managed).
# Also installs (root only, when missing) oneDNN 3.2, Intel's CPU build with GNU OpenMP, from
# PyPI (onednn-cpu-gomp / onednn-devel-cpu-gomp 2023.2.0) into /opt/meshrt-deps/onednn-3.2, which
# CMake's MESHRT_DNNL_ROOT searches first: Debian 12's libdnnl-dev is oneDNN 2.6, which has no f16
# matmul on CPUs and slower AMX bf16 kernels. Without it (pip offline) the build uses Debian's.
# --python-venv: only the venv (no root needed); exits non-zero when pip cannot install.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python_venv() {
  local venv="$root/.venv-ci"
  if "$venv/bin/python" -c "import safetensors, numpy, lizard" 2>/dev/null; then return 0; fi
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || return 1
  echo "install-deps: pip installing safetensors numpy lizard into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check safetensors numpy lizard ||
    return 1
}
onednn3() {
  local dest=/opt/meshrt-deps/onednn-3.2 tmp
  [ -f "$dest/lib/libdnnl.so.3" ] && [ -f "$dest/include/oneapi/dnnl/dnnl.hpp" ] && return 0
  [ "$(id -u)" -eq 0 ] || return 1
  [ -x "$root/.venv-ci/bin/pip" ] || return 1
  echo "install-deps: pip installing oneDNN 3.2 (CPU, GNU OpenMP) into $dest"
  mkdir -p /opt/meshrt-deps
  tmp=$(mktemp -d /opt/meshrt-deps/.onednn.XXXXXX)
  chmod 755 "$tmp"
  if ! "$root/.venv-ci/bin/pip" install -q --disable-pip-version-check --no-deps --no-compile \
      --prefix "$tmp" onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 ||
     [ ! -f "$tmp/lib/libdnnl.so.3.2" ]; then
    rm -rf "$tmp"
    return 1
  fi
  # The wheel holds three copies of the 54 MB library: keep one, link the other names to it.
  ln -sf libdnnl.so.3.2 "$tmp/lib/libdnnl.so.3"
  ln -sf libdnnl.so.3 "$tmp/lib/libdnnl.so"
  rm -rf "$tmp/lib/python3"* "$dest"
  mv "$tmp" "$dest"
}
# torch for meshrt's torch.distributed backend (bindings/torch, tests/torch): root only, once per
# machine, into the venv /opt/meshrt-deps/torch-venv (beside oneDNN; CMake's bindings/torch finds
# it there). MESHRT_TORCH_SPEC picks the version (default torch==2.15.0, from PyPI). PyPI's Linux
# torch depends on ~4 GB of CUDA wheels that CPU collectives never use: first torch alone
# (--no-deps) with its pure-Python dependencies and the few CUDA libraries its core links that the
# system lacks (pinned by torch's own metadata); if that torch does not import, the full install.
torch_venv() {
  local venv=/opt/meshrt-deps/torch-venv spec="${MESHRT_TORCH_SPEC:-torch==2.15.0}" pins
  # The stamp: written once torch imported (importing torch takes seconds on every make test).
  [ -f "$venv/.meshrt-torch-ok" ] && return 0
  [ "$(id -u)" -eq 0 ] || return 1
  mkdir -p /opt/meshrt-deps
  exec 9>/opt/meshrt-deps/.torch-venv.lock  # one install at a time per machine
  flock 9
  [ -f "$venv/.meshrt-torch-ok" ] && return 0
  echo "install-deps: pip installing $spec into $venv (once per machine)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || return 1
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" pytest numpy "scikit-build-core>=0.10" filelock typing-extensions sympy networkx \
    jinja2 fsspec setuptools || return 1
  "${pip[@]}" --no-deps "$spec" || return 1
  pins=$("$venv/bin/python" - <<'PY'
import importlib.metadata as m, re
out = []
for r in m.requires("torch") or []:
    name = re.split(r"[ ;=<>~\[]", r, 1)[0]
    if name in ("nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13", "nvidia-nccl-cu13",
                "nvidia-cusparselt-cu12", "nvidia-nvshmem-cu12", "nvidia-nccl-cu12",
                "nvidia-cufile-cu12"):
        out.append(r.split(";")[0].strip())
    if name == "cuda-toolkit" and "cufile" in r:
        out.append("nvidia-cufile")
print(" ".join(out))
PY
)
  # shellcheck disable=SC2086  # $pins: whole requirement words
  [ -z "$pins" ] || "${pip[@]}" --no-deps $pins || true
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "install-deps: torch without its CUDA wheels does not import here; installing $spec with them"
    "${pip[@]}" "$spec" && "$venv/bin/python" -c "import torch" || return 1
  fi
  echo "$spec" >"$venv/.meshrt-torch-ok"
}
if [ "${1:-}" = "--python-venv" ]; then
  python_venv
  exit $?
fi
pkgs=(build-essential cmake catch2 libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
      libopenblas-dev libopenmpi-dev openmpi-bin libdlpack-dev gnuplot-nox libdnnl-dev
      ninja-build  # the Makefile's generator when present
      ccache  # the Makefile compiles through it when present (a clone reuses earlier objects)
      clang libclang-rt-14-dev)  # clang + compiler-rt: the sanitizer / libFuzzer build (make fuzz)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Optional: Debian's PyTorch (1.13, CPU only, ~140 MB) for the torchrun and PyTorch examples
# (examples/python/torchrun.sh, ctest examples.python.torchrun, which skips, saying why, without
# it). A failure to install it is a warning, not an error.
optional=(python3-torch)
optional_missing=()
for p in "${optional[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    optional_missing+=("$p")
  fi
done
python_venv || echo "install-deps: warning: no .venv-ci with safetensors and lizard (pip offline?); the checkpoint python test and lint.function_length will skip"
torch_venv || echo "install-deps: warning: no torch in /opt/meshrt-deps/torch-venv (not root, or pip offline); the torch tests (ctest -L torch) will skip"
onednn3 || echo "install-deps: warning: no oneDNN 3.2 in /opt/meshrt-deps (not root, or pip offline); the build uses Debian's oneDNN 2.6 (no f16 matmul)"
[ ${#missing[@]} -eq 0 ] && [ ${#optional_missing[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
updated=0
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  updated=1
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#optional_missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${optional_missing[*]} (optional)"
  { [ $updated = 1 ] || $SUDO apt-get update -qq; } &&
    $SUDO apt-get install -y -qq --no-install-recommends "${optional_missing[@]}" >/dev/null ||
    echo "install-deps: warning: could not install ${optional_missing[*]}; examples.python.torchrun will skip"
fi
echo "install-deps: done"
