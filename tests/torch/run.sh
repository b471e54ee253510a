#!/bin/sh
# Runs tests/torch (pytest) with the Python that has torch, over the build tree's meshrt package.
# Usage: run.sh <python> <build>/python [pytest arguments]
# Exits 77 (ctest: skipped), saying why, when that Python lacks torch or pytest or the backend
# was not built.
py="$1"
pkg="$2"
shift 2
here="$(cd "$(dirname "$0")" && pwd)"
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch (tools/install-deps.sh installs it into /opt/meshrt-deps/torch-venv; or configure with -DMESHRT_TORCH_PYTHON=<python with torch>)"
  exit 77
fi
if ! "$py" -c "import pytest" 2>/dev/null; then
  echo "SKIPPED: $py has no pytest ($py -m pip install pytest)"
  exit 77
fi
if ! ls "$pkg"/meshrt/_torch_backend*.so >/dev/null 2>&1; then
  echo "SKIPPED: the torch backend was not built in $pkg (see cmake's 'meshrt torch backend' line)"
  exit 77
fi
PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m pytest -q -p no:cacheprovider "$here" "$@"
