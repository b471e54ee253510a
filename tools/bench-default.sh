#!/usr/bin/env bash
# What `make bench` runs: the most complete benchmark this build has.
set -euo pipefail
build=${1:-build-release}
bin=$build/bin
if "$bin/meshrt" bench --help >/dev/null 2>&1; then
  exec "$bin/meshrt" bench block
fi
"$bin/meshrt" info
for b in meshrt-bench-gemm meshrt-bench-collective; do
  if [ -x "$bin/$b" ]; then echo; echo "== $b"; "$bin/$b"; fi
done
