#!/usr/bin/env bash
# What `make bench` runs: the block benchmark of a build. Every benchmark program (`meshrt` and the
# standalone meshrt-bench-* programs) lands in <build>/bin.
# Usage: tools/bench-default.sh [build-dir] (default build-release)
set -euo pipefail
build=${1:-build-release}
meshrt=$build/bin/meshrt
if [ ! -x "$meshrt" ]; then
  echo "bench-default.sh: no $meshrt: build the meshrt target in $build first (make bench does)" >&2
  exit 2
fi
exec "$meshrt" bench block
