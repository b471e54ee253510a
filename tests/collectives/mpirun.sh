#!/bin/sh
# Runs mpirun for ctest: adds --allow-run-as-root only when running as root (as CI does).
# Usage: mpirun.sh <mpiexec> <mpiexec args...>
mpiexec="$1"
shift
if [ "$(id -u)" = 0 ]; then
  exec "$mpiexec" --allow-run-as-root "$@"
fi
exec "$mpiexec" "$@"
