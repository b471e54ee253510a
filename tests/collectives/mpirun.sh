#!/bin/sh
# Runs mpirun for ctest: adds --allow-run-as-root only when running as root (as CI does).
# Usage: mpirun.sh <mpiexec> <mpiexec args...>
mpiexec="$1"
shift
# Sanitizer builds: LeakSanitizer's suppressions (tools/sanitizers/lsan.supp) name Open MPI's
# libraries, so its leak stacks must reach them: full unwinding (the fast unwinder stops in
# Open MPI's frame-pointer-less code) and components kept loaded (unloaded ones are
# "<unknown module>"). Both are ignored by builds without ASan.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export OMPI_MCA_mca_base_component_disable_dlclose=1
if [ "$(id -u)" = 0 ]; then
  exec "$mpiexec" --allow-run-as-root "$@"
fi
exec "$mpiexec" "$@"
