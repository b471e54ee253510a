#!/bin/sh
# Runs a Python example with the repository's venv (.venv-ci, from tools/install-deps.sh) or,
# without one, python3; exits 77 (skipped) when neither exists.
# Usage: run.sh <repo root> <script> <args...>
root="$1"
shift
py="$root/.venv-ci/bin/python"
if [ ! -x "$py" ]; then py="$(command -v python3 || true)"; fi
if [ -z "$py" ]; then
  echo "SKIPPED: no python3 (run tools/install-deps.sh --python-venv)"
  exit 77
fi
exec "$py" "$@"
