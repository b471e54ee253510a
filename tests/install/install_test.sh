#!/usr/bin/env bash
# The installed package, checked from the outside (ctest install.*; tests/install/CMakeLists.txt).
#   install_test.sh consumer <build> <source> <scratch> <version> <meshrt-cli> <generator> <cc> <cxx> <static ON|OFF>
#       `cmake --install` into <scratch>/prefix, then examples/cmake-consumer built with
#       find_package(meshrt) and with `pkg-config --cflags --libs meshrt` (whose Cflags must add
#       only -I<prefix>/include, and DLPack's folder when it is not the compiler's default); both
#       must run and print the version and exact all-reduce sums; then examples/c, examples/cpp (CMake and one
#       compiler line with only -I<prefix>/include) and examples/python against the install.
#   install_test.sh headers <build> <scratch> <cc> <cxx>
#       exactly the public headers are installed (meshrt.h, the C++ API's .hpp, export.h,
#       version.h); none includes anything but another installed header, <dlpack/dlpack.h> and
#       the standard library; each compiles alone with only -I<prefix>/include (C++17 and C++20;
#       the C headers also as C99).
#   install_test.sh plugins <build> <source> <scratch> <cc> <mpirun.sh> <mpiexec> <forbidden> <cuda ON|OFF>
#       the backends as plugins: the installed libmeshrt.so has no DT_NEEDED on a library matching
#       lib(<forbidden>) (MPI's, CUDA's, NCCL's); with libmeshrt-mpi.so and libmeshrt-cuda.so
#       moved away a C99 consumer builds, runs and loads none of them, an MPI launch and a CUDA
#       world fail with the one-line error naming the plugin and dlerror()'s reason, and a plugin
#       of another meshrt version or without the entry point is refused in one line naming it;
#       MESHRT_BACKEND_PATH, then the folder of libmeshrt.so, find the MPI plugin again for a
#       2-process mpirun, where a meshrt::CommError thrown in the plugin (a call mismatch) reaches
#       the C API as MESHRT_ERROR_COMM with its message; the CUDA plugin next to libmeshrt.so loads (its libraries all resolve)
#       and then makes the world or says why CUDA is unusable, never that it cannot be loaded.
#   install_test.sh c99 <build> <source> <scratch> <c compilers...>
#       meshrt.h compiles alone with each compiler as -std=c99 -Wall -Wextra -Werror -pedantic, and
#       also with __GNUC__ / __clang__ undefined (its non-GNU branches: no __attribute__).
#   install_test.sh exports <libmeshrt.so> <libmeshrt.map> <meshrt.h>
#       libmeshrt.so exports exactly what its version script <libmeshrt.map> allows, which is the
#       one list of it: every dynamic symbol it defines is either a C function declared in
#       <meshrt.h> (and matching the map's C patterns) or a C++ name matching an entry of the
#       map's extern "C++" block (the plugin interface); every function meshrt.h declares is
#       exported; and every entry of the plugin interface matches an exported symbol (no stale
#       entries).
# Reuses the built tree: `cmake --install` copies, it never builds. MESHRT_CONSUMER_FLAGS (set by
# ctest in sanitizer builds) is added to the consumers' compile and link flags: a program loading
# an instrumented libmeshrt.so must be built with the same -fsanitize.
set -euo pipefail
extra=${MESHRT_CONSUMER_FLAGS:-}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

install_into() {  # build prefix log
  cmake --install "$1" --prefix "$2" >"$3" 2>&1 ||
    { cat "$3" >&2; fail "cmake --install $1 failed (is libmeshrt.so built? cmake --build $1)"; }
}

check_output() {  # what log version
  grep -qx "meshrt $3 (header .*)" "$2" || { cat "$2" >&2; fail "$1 did not print 'meshrt $3'"; }
  if ! grep -q "elements exact" "$2" || ! grep -qx "OK" "$2"; then
    cat "$2" >&2
    fail "$1 did not report exact all-reduce sums"
  fi
}

mode=${1:-}
shift || true
case "$mode" in
  consumer)
    build=$1 src=$2 scratch=$3 version=$4 cli=$5 generator=$6 cc=$7 cxx=$8 static=$9
    rm -rf "$scratch" && mkdir -p "$scratch"
    prefix=$scratch/prefix
    # The SONAME's version: major.minor while the major is 0 (cmake/package.cmake), then major.
    sover=${version%%.*}
    [ "$sover" = 0 ] && sover=${version%.*}
    # The CLI and the package report the one version (project() in CMakeLists.txt).
    [ "$("$cli" --version)" = "meshrt $version" ] || fail "'meshrt --version' says '$("$cli" --version)', want 'meshrt $version'"
    install_into "$build" "$prefix" "$scratch/install.log"
    for f in lib/cmake/meshrt/meshrtConfig.cmake lib/cmake/meshrt/meshrtConfigVersion.cmake \
      lib/pkgconfig/meshrt.pc include/meshrt/meshrt.hpp include/meshrt/comm.hpp include/meshrt/version.h \
      include/meshrt/export.h "lib/libmeshrt.so.$version" "lib/libmeshrt.so.$sover"; do
      [ -e "$prefix/$f" ] || fail "the install has no $f"
    done
    # The installed command line runs from the prefix alone (no build tree on its run path).
    [ "$("$prefix/bin/meshrt" --version)" = "meshrt $version" ] ||
      fail "the installed bin/meshrt says '$("$prefix/bin/meshrt" --version 2>&1)', want 'meshrt $version'"
    ! readelf -d "$prefix/bin/meshrt" | grep -E 'R(UN)?PATH' | grep -F "$build" >/dev/null ||
      fail "the installed bin/meshrt has the build tree $build on its run path"

    # 1. CMake: find_package(meshrt 0.2 REQUIRED) + meshrt::meshrt.
    variants=(shared)
    [ "$static" = ON ] && variants+=(static)
    for v in "${variants[@]}"; do
      b=$scratch/cmake-$v
      opt=OFF
      [ "$v" = static ] && opt=ON
      if ! cmake -S "$src/examples/cmake-consumer" -B "$b" -G "$generator" \
        -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
        -DCMAKE_BUILD_TYPE=Release -DMESHRT_CONSUMER_STATIC=$opt -DCMAKE_C_FLAGS="$extra" \
        -DCMAKE_CXX_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" >"$b.configure.log" 2>&1; then
        cat "$b.configure.log" >&2
        fail "configuring examples/cmake-consumer ($v) against $prefix failed"
      fi
      grep -q "meshrt $version from $prefix/lib/cmake/meshrt" "$b.configure.log" ||
        { cat "$b.configure.log" >&2; fail "find_package(meshrt) did not take the package in $prefix"; }
      cmake --build "$b" >"$b.build.log" 2>&1 ||
        { cat "$b.build.log" >&2; fail "building examples/cmake-consumer ($v) failed"; }
      "$b/app" >"$b.run.log" 2>&1 || { cat "$b.run.log" >&2; fail "the $v consumer failed"; }
      check_output "the $v CMake consumer" "$b.run.log" "$version"
      if [ "$v" = shared ]; then
        ldd "$b/app" | grep "libmeshrt.so.$sover => $prefix/lib/" >/dev/null ||
          { ldd "$b/app" >&2; fail "the consumer does not load libmeshrt from $prefix/lib"; }
      fi
      echo "cmake consumer ($v):"
      sed 's/^/  /' "$b.run.log"
    done

    # 2. pkg-config: the same main.cpp from one compiler line.
    export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
    [ "$(pkg-config --modversion meshrt)" = "$version" ] || fail "pkg-config --modversion meshrt is not $version"
    # Cflags: -I<prefix>/include and nothing else, except DLPack's folder (one holding
    # dlpack/dlpack.h) when it is not the compiler's default; never <prefix>/include/meshrt.
    want_inc=$(realpath "$prefix/include")
    cflags=$(pkg-config --cflags meshrt)
    # pkg-config escapes a space in a path as '\ ' for the shell: split its output as the shell does.
    cflag_words=()
    eval "cflag_words=($cflags)"
    seen_prefix=0
    for f in "${cflag_words[@]}"; do
      case "$f" in
        -I*) d=$(realpath -m "${f#-I}") ;;
        *) fail "meshrt.pc's Cflags have '$f' (want only -I<prefix>/include): $cflags" ;;
      esac
      if [ "$d" = "$want_inc" ]; then
        seen_prefix=1
      elif [ ! -f "$d/dlpack/dlpack.h" ]; then
        fail "meshrt.pc's Cflags add $d, which is neither $prefix/include nor DLPack's folder: $cflags"
      fi
    done
    [ $seen_prefix = 1 ] || fail "meshrt.pc's Cflags lack -I$prefix/include: $cflags"
    libs=$(pkg-config --libs meshrt)
    lib_words=()
    eval "lib_words=($libs)"
    [ "$(printf '%s\n' "${lib_words[@]}" | grep -v '^-L' | tr '\n' ' ')" = "-lmeshrt -pthread " ] ||
      fail "meshrt.pc's Libs are '$libs', want -L<prefix>/lib -lmeshrt -pthread"
    echo "meshrt.pc: Cflags $cflags; Libs $libs"
    flags=$(pkg-config --cflags --libs meshrt)
    flag_words=()
    eval "flag_words=($flags)"
    # shellcheck disable=SC2086 # word splitting of $extra is meant
    "$cxx" -std=c++20 -O1 $extra "$src/examples/cmake-consumer/main.cpp" "${flag_words[@]}" -Wl,-rpath,"$prefix/lib" \
      -o "$scratch/app-pkgconfig" >"$scratch/pkgconfig.build.log" 2>&1 ||
      { cat "$scratch/pkgconfig.build.log" >&2; fail "c++ main.cpp \$(pkg-config --cflags --libs meshrt) failed: $flags"; }
    "$scratch/app-pkgconfig" >"$scratch/pkgconfig.run.log" 2>&1 ||
      { cat "$scratch/pkgconfig.run.log" >&2; fail "the pkg-config consumer failed"; }
    check_output "the pkg-config consumer" "$scratch/pkgconfig.run.log" "$version"
    echo "pkg-config consumer: c++ -std=c++20 main.cpp $flags"

    # 3. The C API examples against the installed package: examples/c as strict C99 from one
    # compiler line, and examples/python (the meshrt package + NumPy) on the installed libmeshrt.so.
    "$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra "$src/examples/c/allreduce_threads.c" \
      "${flag_words[@]}" -pthread -Wl,-rpath,"$prefix/lib" -o "$scratch/c-example" >"$scratch/c-example.build.log" 2>&1 ||
      { cat "$scratch/c-example.build.log" >&2; fail "cc -std=c99 examples/c/allreduce_threads.c \$(pkg-config --cflags --libs meshrt) failed"; }
    "$scratch/c-example" >"$scratch/c-example.run.log" 2>&1 ||
      { cat "$scratch/c-example.run.log" >&2; fail "examples/c against the install failed"; }
    grep -q "^meshrt $version, C API" "$scratch/c-example.run.log" && grep -qx "OK: 0 mismatches" "$scratch/c-example.run.log" ||
      { cat "$scratch/c-example.run.log" >&2; fail "examples/c did not report version $version and 0 mismatches"; }
    echo "C example (installed package):"
    sed 's/^/  /' "$scratch/c-example.run.log"
    # shellcheck disable=SC2086 # word splitting of the flags is meant
    "$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra "$src/examples/c/mlp_tp.c" \
      "${flag_words[@]}" -pthread -lm -Wl,-rpath,"$prefix/lib" -o "$scratch/c-mlp" >"$scratch/c-mlp.build.log" 2>&1 ||
      { cat "$scratch/c-mlp.build.log" >&2; fail "cc -std=c99 examples/c/mlp_tp.c \$(pkg-config --cflags --libs meshrt) failed"; }
    "$scratch/c-mlp" >"$scratch/c-mlp.run.log" 2>&1 ||
      { cat "$scratch/c-mlp.run.log" >&2; fail "examples/c/mlp_tp.c against the install failed"; }
    grep -qx "OK: 0 mismatches" "$scratch/c-mlp.run.log" ||
      { cat "$scratch/c-mlp.run.log" >&2; fail "examples/c/mlp_tp.c did not report 0 mismatches"; }
    echo "C MLP example (installed package):"
    sed 's/^/  /' "$scratch/c-mlp.run.log"
    # 4. The C++ examples (the public C++ API) against the installed package: with CMake
    # (find_package), and from one compiler line that adds only -I<prefix>/include.
    b=$scratch/cpp-examples
    cmake -S "$src/examples/cpp" -B "$b" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$extra" \
      -DCMAKE_EXE_LINKER_FLAGS="$extra" >"$b.configure.log" 2>&1 &&
      cmake --build "$b" >"$b.build.log" 2>&1 ||
      { cat "$b.configure.log" "$b.build.log" >&2 2>/dev/null; fail "building examples/cpp against $prefix failed"; }
    for ex in allreduce mlp_tp; do
      # shellcheck disable=SC2086
      "$cxx" -std=c++17 -Wall -Wextra -Wpedantic -Werror $extra "$src/examples/cpp/$ex.cpp" \
        -I"$prefix/include" -L"$prefix/lib" -lmeshrt -pthread -Wl,-rpath,"$prefix/lib" \
        -o "$scratch/cpp-$ex" >"$scratch/cpp-$ex.build.log" 2>&1 ||
        { cat "$scratch/cpp-$ex.build.log" >&2; fail "c++ -std=c++17 examples/cpp/$ex.cpp -I$prefix/include failed"; }
      for exe in "$b/$ex" "$scratch/cpp-$ex"; do
        "$exe" >"$exe.run.log" 2>&1 || { cat "$exe.run.log" >&2; fail "examples/cpp/$ex ($exe) failed"; }
        grep -qx "OK: 0 mismatches" "$exe.run.log" ||
          { cat "$exe.run.log" >&2; fail "examples/cpp/$ex ($exe) did not report 0 mismatches"; }
      done
      echo "C++ example $ex (installed package, CMake and -I$prefix/include):"
      sed 's/^/  /' "$b/$ex.run.log"
    done
    # run_py <python> <script> <title>: runs examples/python/<script> on the installed library;
    # it must print OK.
    run_py() {
      log=$scratch/$2.run.log
      "$1" "$src/examples/python/$2" "$prefix/lib/libmeshrt.so" >"$log" 2>&1 ||
        { cat "$log" >&2; fail "examples/python/$2 against $prefix/lib/libmeshrt.so failed"; }
      grep -qx "OK" "$log" || { cat "$log" >&2; fail "examples/python/$2 did not print OK"; }
      echo "$3 (installed libmeshrt.so, $1):"
      sed 's/^/  /' "$log"
    }
    py=$src/.venv-ci/bin/python
    if [ -x "$py" ] && "$py" -c "import numpy" 2>/dev/null; then
      run_py "$py" allreduce_numpy.py "Python example"
      run_py "$py" allreduce_processes.py "Python example, one process per rank"
      run_py "$py" mlp_numpy.py "Python MLP example"
    else
      echo "Python example: not run (no .venv-ci with numpy; tools/install-deps.sh --python-venv makes it)"
    fi
    # The PyTorch variant (optional): MESHRT_TORCH_PYTHON, else .venv-torch, else .venv-ci, else
    # the system's python3 (Debian's python3-torch, which tools/install-deps.sh tries to install).
    tpy=""
    for cand in "${MESHRT_TORCH_PYTHON:-}" "$src/.venv-torch/bin/python" "$py" /usr/bin/python3; do
      if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c "import torch, numpy" 2>/dev/null; then
        tpy=$cand
        break
      fi
    done
    if [ -n "$tpy" ]; then
      run_py "$tpy" attn_torch.py "PyTorch attention example"
    else
      echo "PyTorch example: skipped (no python with torch and numpy: set MESHRT_TORCH_PYTHON, apt-get install python3-torch, or make .venv-torch with pip install torch numpy)"
    fi
    echo "PASS"
    ;;

  headers)
    build=$1 scratch=$2 cc=$3 cxx=$4
    rm -rf "$scratch" && mkdir -p "$scratch/tu"
    prefix=$scratch/prefix
    install_into "$build" "$prefix" "$scratch/install.log"
    cd "$prefix/include"
    mapfile -t headers < <(find . -type f | sed 's|^\./||' | sort)
    want="meshrt/blocks.hpp meshrt/comm.hpp meshrt/export.h meshrt/mesh.hpp meshrt/meshrt.h meshrt/meshrt.hpp meshrt/tensor.hpp meshrt/version.h"
    [ "${headers[*]}" = "$want" ] || fail "installed under include/: ${headers[*]}
want exactly the public headers: $want"
    # No installed header includes anything but another installed one, DLPack and the standard
    # library (names without a folder): nothing internal is reachable from the package.
    bad=""
    for h in "${headers[@]}"; do
      while IFS= read -r line; do
        inc=$(echo "$line" | sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*//')
        case "$inc" in
          \<meshrt/*\>) [ -f "${inc:1:${#inc}-2}" ] || bad+="$h: $line (not installed)"$'\n' ;;
          "<dlpack/dlpack.h>") ;;
          \<*/*\>) bad+="$h: $line (not a public header)"$'\n' ;;
          \<*\>) ;;
          *) bad+="$h: $line (quoted: the public headers include <meshrt/...>)"$'\n' ;;
        esac
      done < <(grep -E '^[[:space:]]*#[[:space:]]*include' "$h" | sed -E 's@[[:space:]]*(//|/\*).*$@@')
    done
    [ -z "$bad" ] || fail "installed headers include non-public headers:
$bad"
    # One translation unit per header, including only it; C headers (.h without C++) also as C99.
    for h in "${headers[@]}"; do
      tu=$scratch/tu/$(echo "$h" | tr '/.' '__')
      # (the typedef keeps a C file that only defines macros from being an empty unit)
      printf '#include <%s>\ntypedef int meshrt_header_test_unit;\n' "$h" >"$tu.cpp"
      for std in c++17 c++20; do
        printf '%q ' "$cxx" "-std=$std" -fsyntax-only -Wall -Wextra -Wpedantic -Werror \
          "-I$prefix/include" "$tu.cpp" >>"$scratch/commands"
        echo >>"$scratch/commands"
      done
      case "$h" in
        meshrt/version.h | meshrt/export.h | meshrt/meshrt.h)
          printf '#include <%s>\ntypedef int meshrt_header_test_unit;\n' "$h" >"$tu.c"
          printf '%q ' "$cc" -std=c99 -fsyntax-only -Wall -Wextra -Wpedantic -Werror \
            "-I$prefix/include" "$tu.c" >>"$scratch/commands"
          echo >>"$scratch/commands"
          ;;
      esac
    done
    status=0
    # Each line is one command with its words shell-quoted (printf %q); -d keeps xargs from
    # reading quotes itself.
    # shellcheck disable=SC2016
    xargs -P 2 -d '\n' -I{} bash -c '{} 2>&1 || { echo "FAILED: {}"; exit 1; }' <"$scratch/commands" >"$scratch/compile.log" || status=1
    if [ $status -ne 0 ]; then
      cat "$scratch/compile.log" >&2
      fail "some installed headers do not compile alone (see FAILED lines above)"
    fi
    echo "$(wc -l <"$scratch/commands") translation units compiled, ${#headers[@]} headers:"
    printf '  %s\n' "${headers[@]}"
    echo "PASS"
    ;;

  plugins)
    build=$1 src=$2 scratch=$3 cc=$4 mpirun=$5 mpiexec=$6 forbid=$7 cuda=$8
    rm -rf "$scratch" && mkdir -p "$scratch/plugins"
    prefix=$scratch/prefix
    lib=$prefix/lib
    install_into "$build" "$prefix" "$scratch/install.log"
    [ -f "$lib/libmeshrt-mpi.so" ] || fail "the install has no lib/libmeshrt-mpi.so"
    plugins=(mpi)
    if [ "$cuda" = ON ]; then
      [ -f "$lib/libmeshrt-cuda.so" ] || fail "the CUDA build's install has no lib/libmeshrt-cuda.so"
      plugins+=(cuda)
    fi
    # 1. The core's own dependencies name no backend library.
    needed=$(readelf -d "$lib/libmeshrt.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    bad=$(printf '%s\n' "$needed" | grep -E "^lib($forbid)[.-]" || true)
    [ -z "$bad" ] || fail "libmeshrt.so has DT_NEEDED on backend libraries: $(echo $bad) (they belong in the plugins)"
    echo "libmeshrt.so needs: $(echo $needed)"
    # 2. Without the plugins a CPU-only consumer links, runs and maps no backend library.
    for p in "${plugins[@]}"; do mv "$lib/libmeshrt-$p.so" "$scratch/plugins/"; done
    flags=("-I$prefix/include" "-L$lib" -lmeshrt "-Wl,-rpath,$lib")
    # shellcheck disable=SC2086 # word splitting of $extra is meant
    "$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra "$src/examples/c/allreduce_threads.c" "${flags[@]}" \
      -pthread -o "$scratch/c-example" >"$scratch/c-example.build.log" 2>&1 ||
      { cat "$scratch/c-example.build.log" >&2; fail "building examples/c/allreduce_threads.c failed"; }
    env -u MESHRT_BACKEND_PATH "$scratch/c-example" >"$scratch/c-example.run.log" 2>&1 ||
      { cat "$scratch/c-example.run.log" >&2; fail "examples/c failed without the plugins"; }
    grep -qx "OK: 0 mismatches" "$scratch/c-example.run.log" ||
      { cat "$scratch/c-example.run.log" >&2; fail "examples/c did not report 0 mismatches"; }
    # The libraries the core must not need ($forbid: MPI's, CUDA's, NCCL's) are not mapped either.
    mapped=$(ldd "$scratch/c-example" | grep -E "lib($forbid)[.-]" || true)
    [ -z "$mapped" ] || fail "a CPU-only consumer loads backend libraries: $mapped"
    echo "CPU-only consumer without plugins: OK: 0 mismatches, none of lib($forbid) loaded"
    # 2b. The same on a machine without the backend libraries: in a private mount namespace every
    # file the dynamic loader could find for lib($forbid) (its cache, /usr/local/cuda*) is
    # covered by an empty one. Needs root (CI's case); elsewhere it says it did not run.
    { ldconfig -p | sed -n 's/.* => //p'; ls -d /usr/local/cuda*/lib*/* 2>/dev/null; } |
      grep -E "/lib($forbid)[.-][^/]*$" | while read -r f; do readlink -f "$f"; done |
      sort -u >"$scratch/hidden.list"
    hide() {  # hide <command...>: runs it with every file of hidden.list empty
      unshare -m --propagation private sh -c 'while read -r f; do
          mount --bind /dev/null "$f" || exit 90; [ -s "$f" ] && exit 91; done <"$0"; exec "$@"' \
        "$scratch/hidden.list" "$@"
    }
    if [ "$(id -u)" = 0 ] && hide true 2>/dev/null; then
      hide env -u MESHRT_BACKEND_PATH "$scratch/c-example" >"$scratch/c-hidden.log" 2>&1 ||
        { cat "$scratch/c-hidden.log" >&2; fail "examples/c failed with the backend libraries hidden"; }
      grep -qx "OK: 0 mismatches" "$scratch/c-hidden.log" ||
        { cat "$scratch/c-hidden.log" >&2; fail "examples/c did not report 0 mismatches (libraries hidden)"; }
      echo "CPU-only consumer with $(wc -l <"$scratch/hidden.list") backend libraries hidden: OK: 0 mismatches"
      hidden=1
    else
      echo "NOTE: backend libraries not hidden (needs root and unshare -m): the ldd check above stands"
      hidden=0
    fi
    # 3. An MPI launch without the plugin: one line naming it and why.
    # shellcheck disable=SC2086
    "$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra "$src/tests/install/plugin_check.c" "${flags[@]}" \
      -o "$scratch/plugin-check" >"$scratch/plugin-check.build.log" 2>&1 ||
      { cat "$scratch/plugin-check.build.log" >&2; fail "building tests/install/plugin_check.c failed"; }
    env -u MESHRT_BACKEND_PATH OMPI_COMM_WORLD_SIZE=1 "$scratch/plugin-check" >"$scratch/missing.log" 2>&1 &&
      fail "meshrt_comm_init_mpi succeeded without libmeshrt-mpi.so"
    want="FAILED unsupported: meshrt_comm_init_mpi: cannot load the mpi backend (libmeshrt-mpi.so): libmeshrt-mpi.so: cannot open shared object file: No such file or directory (searched $lib; set MESHRT_BACKEND_PATH to its folder)"
    [ "$(cat "$scratch/missing.log")" = "$want" ] ||
      { cat "$scratch/missing.log" >&2; fail "the missing-plugin error is not the one line: $want"; }
    echo "missing plugin: $(cat "$scratch/missing.log")"
    # 4. MESHRT_BACKEND_PATH finds it; then its place next to libmeshrt.so does.
    for where in env lib; do
      if [ $where = lib ]; then
        mv "$scratch/plugins/libmeshrt-mpi.so" "$lib/"
        run=(env -u MESHRT_BACKEND_PATH)
      else
        run=(env "MESHRT_BACKEND_PATH=/nonexistent:$scratch/plugins")
      fi
      "${run[@]}" "$mpirun" "$mpiexec" -np 2 --bind-to none "$scratch/plugin-check" \
        >"$scratch/mpi-$where.log" 2>&1 || { cat "$scratch/mpi-$where.log" >&2; fail "mpirun -np 2 with the plugin ($where) failed"; }
      for r in 0 1; do
        grep -qx "MPI OK rank $r of 2" "$scratch/mpi-$where.log" ||
          { cat "$scratch/mpi-$where.log" >&2; fail "rank $r did not report 'MPI OK rank $r of 2' ($where)"; }
      done
      echo "MPI through the plugin ($where): 2 ranks OK"
    done
    # 4a. An error thrown inside the plugin crosses into the core: the ranks all-gather different
    # counts, the plugin's MPI engine throws meshrt::CommError, and the core's C API catches it
    # by type (typeinfo exported by libmeshrt.so, cmake/libmeshrt.map): MESHRT_ERROR_COMM with
    # the plugin's message, not MESHRT_ERROR_INTERNAL.
    env -u MESHRT_BACKEND_PATH "$mpirun" "$mpiexec" -np 2 --bind-to none "$scratch/plugin-check" \
      mismatch >"$scratch/mpi-mismatch.log" 2>&1 ||
      { cat "$scratch/mpi-mismatch.log" >&2; fail "mpirun -np 2 plugin-check mismatch failed"; }
    for r in 0 1; do
      grep -q "^MISMATCH OK rank $r: meshrt_[a-z_]*: collective mismatch on group 'world'" \
        "$scratch/mpi-mismatch.log" ||
        { cat "$scratch/mpi-mismatch.log" >&2; fail "rank $r: the plugin's CommError did not surface as MESHRT_ERROR_COMM"; }
    done
    echo "plugin error through the core: $(grep -m1 '^MISMATCH OK rank 0' "$scratch/mpi-mismatch.log")"
    # 4b. The plugin is there but Open MPI is not (hidden as in 2b): one line naming what is missing.
    if [ "$hidden" = 1 ]; then
      hide env -u MESHRT_BACKEND_PATH OMPI_COMM_WORLD_SIZE=1 "$scratch/plugin-check" \
        >"$scratch/mpi-hidden.log" 2>&1 && fail "meshrt_comm_init_mpi succeeded with Open MPI hidden"
      [ "$(wc -l <"$scratch/mpi-hidden.log")" -eq 1 ] &&
        grep -Eq "^FAILED unsupported: meshrt_comm_init_mpi: cannot load the mpi backend \(libmeshrt-mpi.so\): .*libmpi[.]so.* \(searched .*; set MESHRT_BACKEND_PATH to its folder\)$" \
          "$scratch/mpi-hidden.log" ||
        { cat "$scratch/mpi-hidden.log" >&2; fail "Open MPI hidden: not one line naming libmpi"; }
      echo "plugin without Open MPI: $(cat "$scratch/mpi-hidden.log")"
    fi
    # 5. A CUDA world without libmeshrt-cuda.so: one line naming it and why.
    if [ "$cuda" = ON ]; then
      # shellcheck disable=SC2086
      "$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra "$src/tests/install/cuda_check.c" "${flags[@]}" \
        -o "$scratch/cuda-check" >"$scratch/cuda-check.build.log" 2>&1 ||
        { cat "$scratch/cuda-check.build.log" >&2; fail "building tests/install/cuda_check.c failed"; }
      env -u MESHRT_BACKEND_PATH "$scratch/cuda-check" >"$scratch/cuda-missing.log" 2>&1 &&
        fail "a CUDA world was made without libmeshrt-cuda.so"
      want="FAILED unsupported: meshrt_comm_init_all: meshrt_comm_config.device_type is MESHRT_DEVICE_CUDA but cannot load the cuda backend (libmeshrt-cuda.so): libmeshrt-cuda.so: cannot open shared object file: No such file or directory (searched $lib; set MESHRT_BACKEND_PATH to its folder): use MESHRT_DEVICE_CPU or install meshrt's CUDA backend"
      [ "$(cat "$scratch/cuda-missing.log")" = "$want" ] ||
        { cat "$scratch/cuda-missing.log" >&2; fail "the missing-plugin error is not the one line: $want"; }
      echo "missing plugin: $(cat "$scratch/cuda-missing.log")"
    fi
    # 6. Plugins the loader refuses, each in one line naming the file: another meshrt version's,
    # and a library without the entry point.
    for p in "${plugins[@]}"; do
      for kind in version noentry; do
        d=$scratch/fake-$p-$kind
        mkdir -p "$d"
        defs=(-DFAKE_NAME="\"$p\"")
        [ $kind = noentry ] && defs+=(-DFAKE_NO_ENTRY)
        "$cc" -std=c99 -Wall -Wextra -pedantic -Werror -shared -fPIC "${defs[@]}" \
          "$src/tests/install/fake_plugin.c" -o "$d/libmeshrt-$p.so" >"$d.build.log" 2>&1 ||
          { cat "$d.build.log" >&2; fail "building tests/install/fake_plugin.c ($p, $kind) failed"; }
        if [ "$p" = mpi ]; then
          env MESHRT_BACKEND_PATH="$d" OMPI_COMM_WORLD_SIZE=1 "$scratch/plugin-check" >"$d.log" 2>&1 &&
            fail "meshrt_comm_init_mpi accepted $d/libmeshrt-mpi.so"
        else
          env MESHRT_BACKEND_PATH="$d" "$scratch/cuda-check" >"$d.log" 2>&1 &&
            fail "a CUDA world was made with $d/libmeshrt-cuda.so"
        fi
        if [ $kind = version ]; then
          why="cannot load the $p backend: $d/libmeshrt-$p.so is $p 0.0.0 (plugin ABI 1), not the $p plugin of meshrt "
        else
          why="cannot load the $p backend: $d/libmeshrt-$p.so has no meshrt_backend_init_v1 entry point: not a meshrt plugin"
        fi
        [ "$(wc -l <"$d.log")" = 1 ] && grep -qF "$why" "$d.log" ||
          { cat "$d.log" >&2; fail "the $kind refusal of a fake $p plugin is not one line with: $why"; }
        echo "refused ($p, $kind): $(cat "$d.log")"
      done
    done
    # 7. The CUDA plugin next to libmeshrt.so loads: its own libraries resolve, and the world is
    # made (a GPU machine) or CUDA is said to be unusable (no GPU), but never "cannot load".
    if [ "$cuda" = ON ]; then
      mv "$scratch/plugins/libmeshrt-cuda.so" "$lib/"
      unresolved=$(ldd "$lib/libmeshrt-cuda.so" | grep "not found" || true)
      [ -z "$unresolved" ] || fail "libmeshrt-cuda.so has unresolved libraries: $unresolved"
      echo "libmeshrt-cuda.so needs: $(readelf -d "$lib/libmeshrt-cuda.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
      env -u MESHRT_BACKEND_PATH "$scratch/cuda-check" >"$scratch/cuda-present.log" 2>&1 || true
      got=$(cat "$scratch/cuda-present.log")
      if [ "$got" != "CUDA OK: 1 rank" ]; then
        [ "$(wc -l <"$scratch/cuda-present.log")" = 1 ] && ! grep -q "cannot load" "$scratch/cuda-present.log" &&
          grep -q "CUDA" "$scratch/cuda-present.log" ||
          { cat "$scratch/cuda-present.log" >&2; fail "with libmeshrt-cuda.so installed the CUDA world neither worked nor said why CUDA is unusable"; }
      fi
      echo "CUDA through the plugin: $got"
    fi
    echo "PASS"
    ;;

  c99)
    build=$1 src=$2 scratch=$3
    shift 3
    rm -rf "$scratch" && mkdir -p "$scratch"
    printf '#include <meshrt/meshrt.h>\ntypedef int meshrt_c99_unit;\n' >"$scratch/unit.c"
    n=0
    for c in "$@"; do
      for mode in gnu other; do
        opts=()
        [ $mode = other ] && opts=(-U__GNUC__ -U__clang__)
        "$c" -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only "${opts[@]}" -I"$src/include" \
          -I"$build/include" "$scratch/unit.c" >"$scratch/$n.log" 2>&1 ||
          { cat "$scratch/$n.log" >&2; fail "$c -std=c99 -pedantic ${opts[*]} on meshrt.h failed"; }
        echo "meshrt.h: $c -std=c99 -Wall -Wextra -Werror -pedantic ${opts[*]}: clean"
        n=$((n + 1))
      done
    done
    [ $n -ge 2 ] || fail "no C compiler given"
    echo "PASS"
    ;;

  exports)
    lib=$1 map=$2 header=$3
    [ -f "$lib" ] || fail "$lib does not exist (build meshrt_shared)"
    # The map's global entries, one a line: "c <glob>", "c++ <glob>" or "c++= <exact name>" (a
    # quoted entry); comments dropped.
    entries=$(perl -0777 -ne 's{/\*.*?\*/}{}gs; /global:(.*?)local:/s or die "no global: ... local: in $ARGV\n";
      my $g = $1; my $cxx = "";
      $cxx = $1 if $g =~ s/extern\s*"C\+\+"\s*\{(.*?)\}\s*;//s;
      for (split /;/, $g) { s/^\s+|\s+$//g; print "c $_\n" if length }
      for (split /;/, $cxx) { s/^\s+|\s+$//g; next unless length;
        if (/^"(.*)"$/) { print "c++= $1\n" } else { print "c++ $_\n" } }' "$map") ||
      fail "cannot read the global entries of $map"
    mapfile -t c_globs < <(printf '%s\n' "$entries" | sed -n 's/^c //p')
    mapfile -t cxx_entries < <(printf '%s\n' "$entries" | sed -n 's/^\(c++=\{0,1\}\) /\1 /p')
    [ ${#c_globs[@]} -gt 0 ] || fail "$map has no C entries (meshrt_*)"
    # The C API: every function meshrt.h declares (MESHRT_C_API at the start of a line).
    mapfile -t c_api < <(perl -0777 -ne 'print "$1\n" while /^MESHRT_C_API\b[^;]*?\b(meshrt_\w+)\s*\(/gms' "$header" | sort -u)
    [ ${#c_api[@]} -gt 10 ] || fail "found only ${#c_api[@]} MESHRT_C_API functions in $header"
    declare -A in_header=() cxx_used=()
    for f in "${c_api[@]}"; do in_header[$f]=1; done
    mapfile -t raw < <(nm -D --defined-only "$lib" | awk 'NF == 3 { print $3 }' | sort -u)
    [ ${#raw[@]} -gt 0 ] || fail "nm -D --defined-only $lib listed nothing"
    declare -A exported=()
    bad=() n_c=0 n_cxx=0
    for sym in "${raw[@]}"; do
      if [[ $sym != _Z* ]]; then
        exported[$sym]=1
        ok=0
        for g in "${c_globs[@]}"; do
          # shellcheck disable=SC2254 # the entry is a glob, as in the version script
          case "$sym" in $g) ok=1 ;; esac
        done
        if [ $ok = 1 ] && [ -n "${in_header[$sym]:-}" ]; then
          n_c=$((n_c + 1))
        else
          bad+=("$sym (C: not a function of meshrt.h)")
        fi
        continue
      fi
      name=$(c++filt "$sym")
      ok=0
      for e in "${cxx_entries[@]}"; do
        kind=${e%% *} pat=${e#* }
        if [ "$kind" = "c++=" ]; then
          [ "$name" = "$pat" ] && ok=1 && cxx_used[$e]=1
        else
          # shellcheck disable=SC2254
          case "$name" in $pat) ok=1 cxx_used[$e]=1 ;; esac
        fi
      done
      if [ $ok = 1 ]; then n_cxx=$((n_cxx + 1)); else bad+=("$name"); fi
    done
    if [ ${#bad[@]} -gt 0 ]; then
      printf '  %s\n' "${bad[@]}" >&2
      fail "libmeshrt.so exports ${#bad[@]} symbols outside the C API and the plugin interface (listed above); $map is the one list of what it exports: hide them (-fvisibility=hidden, no MESHRT_API / MESHRT_PLUGIN_API), or, for what a plugin needs, add them to its extern \"C++\" block"
    fi
    missing=()
    for f in "${c_api[@]}"; do [ -n "${exported[$f]:-}" ] || missing+=("$f"); done
    [ ${#missing[@]} -eq 0 ] ||
      fail "meshrt.h declares functions libmeshrt.so does not export: ${missing[*]}"
    stale=()
    for e in "${cxx_entries[@]}"; do [ -n "${cxx_used[$e]:-}" ] || stale+=("${e#* }"); done
    [ ${#stale[@]} -eq 0 ] || fail "entries of $map's plugin interface match no exported symbol (drop them, or export what they name): ${stale[*]}"
    echo "${#raw[@]} exported symbols: $n_c C API functions (all ${#c_api[@]} of meshrt.h), $n_cxx of the plugin interface (${#cxx_entries[@]} entries of $(basename "$map"))"
    echo "PASS"
    ;;

  *)
    fail "usage: install_test.sh consumer|headers|plugins|c99|exports ... (see the header of this script)"
    ;;
esac
