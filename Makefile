# meshrt: `make test` (deps, configure, build, all CPU tests) and `make bench` (Release build,
# the main benchmark). Variables: BUILD (build dir), CUDA (AUTO|ON|OFF), JOBS, TEST_JOBS,
# CMAKE_ARGS.
# Sanitizers and fuzzing: `make sanitize` (one clang build with ASan + UBSan and libFuzzer's
# coverage: the unit and multirank suites), `make fuzz` (that build's fuzz targets, FUZZ_SECONDS
# each), `make tsan` (ThreadSanitizer: the multirank suite).
BUILD ?= build
BENCH_BUILD ?= build-release
CUDA ?= AUTO
JOBS ?= $(shell nproc)
# `make test`'s ctest runs two entries more than JOBS at once: its longest entries (the mpirun
# signal and fault scripts, torchrun) mostly wait (Open MPI's kill timeout, injected stalls), and
# with JOBS slots they left the cores idle (the suite: 445-469 s at -j2 on 2 cores, 244 s at -j6).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) + 2 )))
CMAKE_ARGS ?=
# CCACHE: every build compiles through ccache when it is installed (tools/install-deps.sh installs
# it), so a second clone, the sanitizer stages of a later CI run and a worktree reuse the objects
# of earlier builds on this machine. Paths are hashed relative to the clone (CCACHE_BASEDIR) and
# the build folder is not hashed (CCACHE_NOHASHDIR), so a clone elsewhere hits the same entries.
# CCACHE= (empty) builds without it.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
LAUNCHER = $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE) \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=$(CCACHE))
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
CTEST_ARGS ?=
SAN_BUILD ?= build-san
TSAN_BUILD ?= build-tsan
FUZZ_SECONDS ?= 60
# GENERATOR: CMake's generator for a new build directory (an existing one keeps the one it was
# made with). Ninja schedules the objects of every target at once; make's generator builds a
# target's objects only after its dependencies, which leaves a core idle behind the sanitizer
# builds' large unity units.
GENERATOR ?= $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)
gen = $(if $(wildcard $(1)/CMakeCache.txt),,-G "$(GENERATOR)")
CLANG ?= clang
CLANGXX ?= clang++
# Sanitizer runtime options for every test run here (harmless for other builds): Open MPI's
# process-lifetime allocations are not leaks, OpenBLAS's spin-wait pool is not a race (each file
# says why). The paths are quoted for the runtimes' option parser: the folder may hold spaces.
export LSAN_OPTIONS ?= suppressions='$(CURDIR)/tools/sanitizers/lsan.supp':print_suppressions=0
export TSAN_OPTIONS ?= suppressions='$(CURDIR)/tools/sanitizers/tsan.supp':halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
# Tests that ask for absurd sizes expect meshrt's "cannot allocate" error, not the sanitizer's abort
# (allocator_may_return_null, in TSAN_OPTIONS above too).
export ASAN_OPTIONS ?= allocator_may_return_null=1:detect_leaks=1
# Install tests (packaging) and the Python examples (ctypes cannot load a sanitized library into
# an uninstrumented interpreter) do not run in sanitizer builds; they are built with
# MESHRT_BUILD_SHARED=OFF.
# SAN_G / TSAN_G: the sanitizer builds' debug information; the reports need file:line only.
# Measured stage times with these instead of -g: ASan + UBSan 950 -> 937 s, TSan 759 -> 622 s.
SAN_G ?= -gline-tables-only
TSAN_G ?= -g1
# TEST_G: the same for `make test`'s RelWithDebInfo build: line tables (backtraces, gdb and
# sanitizer file:line, no local variables) compile ~30% faster than -g (test_cli.cpp 45.8 -> 30.5
# s). `make build TEST_G=-g` for full debug information (every configure passes it).
TEST_G ?= -g1
# SAN_ISA / TSAN_ISA: the host loop variants (kernels/host/isa.h) the sanitizer builds compile.
# The loops are one source per variant; ASan + UBSan keep avx2 to build clang's target pragmas and
# run the variant test, TSan (threads, not loops) the baseline only.
SAN_ISA ?= baseline;avx2
TSAN_ISA ?= baseline
# TSAN_EXCLUDE: cases TSan cannot run. The C API's two-process cases fork() the test process,
# whose OpenBLAS pool threads already run, and the children start threads: TSan refuses that
# ("starting new threads after multi-threaded fork is not supported"). The MFU-label case sets
# MESHRT_HOST_F32_GEMM=bf16 and the [deterministic] rerun MESHRT_HOST_F32_GEMM=onednn, which put
# every f32 GEMM on oneDNN (see below; under TSan the rerun reports races inside libdnnl.so). make
# test and ASan run them. Also the shm matrix on 4 processes, as in ASan (SAN_EXCLUDE says why).
TSAN_EXCLUDE ?= capi: (file|TCP) rendezvous of 2 CPU processes|MFU label says whether f32 GEMMs|deterministic cases with MESHRT_HOST_F32_GEMM=onednn|$(SAN_SHM_EXCLUDE)
# The TSan suite runs bf16 GEMMs on the f32 path (MESHRT_HOST_BF16_GEMM=f32) and f32 GEMMs on
# OpenBLAS (MESHRT_HOST_F32_GEMM=openblas): on CPUs with AVX512-BF16 the default bf16 path is
# oneDNN, and the default f32 path may be, whose uninstrumented thread pool and primitive cache
# TSan reports (a race in its rwlock) and then fails the process even when suppressed (exit 66,
# no report). make test and ASan run the oneDNN paths.
# SAN_UNITY: the sanitizer builds compile each target's sources in batches (CMake's unity build;
# the kernel loop variants stay one file each): ASan + UBSan's build 790 -> 561 s, TSan's 435 ->
# ~260 s here, most of their stages' time. `make test`'s build compiles every file alone, so a missing #include still fails
# there. SAN_UNITY=OFF for a sanitizer build file by file.
SAN_UNITY ?= ON
SAN_CMAKE = -DCMAKE_UNITY_BUILD=$(SAN_UNITY) -DMESHRT_CUDA=OFF -DMESHRT_WERROR=ON -DMESHRT_BUILD_SHARED=OFF -DCMAKE_BUILD_TYPE=Debug
# The suites a sanitizer build needs (not the benchmarks' Release extras or the install tests).
SAN_TARGETS = meshrt meshrt-bench-collective meshrt-bench-gemm test_runtime test_kernels \
  test_collectives_host test_collectives_shm test_mesh test_tools test_capi \
  meshrt_example_c_allreduce meshrt_example_c_mlp meshrt_example_cpp_allreduce \
  meshrt_example_cpp_mlp_tp
TSAN_TARGETS = meshrt meshrt-bench-collective meshrt-bench-gemm test_collectives_host \
  test_collectives_shm test_mesh test_tools test_capi meshrt_example_c_allreduce \
  meshrt_example_c_mlp meshrt_example_cpp_allreduce meshrt_example_cpp_mlp_tp

.PHONY: all deps configure build test bench format clean sanitize san-build fuzz tsan soak

all: build

deps:
	@tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(call gen,$(BUILD)) -DMESHRT_CUDA=$(CUDA) -DMESHRT_WERROR=ON \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 $(TEST_G) -DNDEBUG" \
	  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 $(TEST_G) -DNDEBUG" \
	  "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -Xcompiler=$(TEST_G) -DNDEBUG" $(LAUNCHER) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# CPU tests: every label but cuda (cuda cases also skip themselves without a GPU).
test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -j $(TEST_JOBS) $(CTEST_ARGS)

bench: deps
	@cmake -S . -B $(BENCH_BUILD) $(call gen,$(BENCH_BUILD)) -DCMAKE_BUILD_TYPE=Release -DMESHRT_CUDA=$(CUDA) \
	  -DMESHRT_BUILD_TESTS=OFF $(LAUNCHER) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS)
	@tools/bench-default.sh $(BENCH_BUILD)

san-build: deps
	@cmake -S . -B $(SAN_BUILD) $(call gen,$(SAN_BUILD)) -DCMAKE_C_COMPILER=$(CLANG) -DCMAKE_CXX_COMPILER=$(CLANGXX) \
	  $(SAN_CMAKE) "-DCMAKE_CXX_FLAGS_DEBUG=-O1 $(SAN_G)" "-DCMAKE_C_FLAGS_DEBUG=-O1 $(SAN_G)" \
	  -DMESHRT_SANITIZE=address,undefined -DMESHRT_FUZZ=ON "-DMESHRT_HOST_ISA_VARIANTS=$(SAN_ISA)" \
	  $(LAUNCHER) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(SAN_BUILD) -j $(JOBS) --target $(SAN_TARGETS) fuzz

# ASan + UBSan: the unit and multirank suites (fuzz.<name>.corpus replays every corpus input).
# Left to `make test`: the kernels suite's reruns under a narrower MESHRT_HOST_ISA (the variant
# test of the suite itself compares the variants here) and the attention twins' tolerance
# margins (numerics of the float64 twin; about 225 s of CPU at -O1 with ASan, while the attention
# kernels' own cases run here); and the shm matrix on 4 processes (SAN_SHM_EXCLUDE, also left
# out of TSan): 95 s under ASan, 4 ranks taking turns on 2 cores, for the code the 2- and
# 3-process matrices run here too (the same per-rank paths; 3 covers a world that does not
# divide the sizes evenly). Sanitizer builds also run test_zero's jitter rerun on 2 of its 5
# layouts (MESHRT_TEST_ZERO_LAYOUTS=short, set in tests/mesh/CMakeLists.txt: 94 s under ASan with
# all 5): its plain entries run all 5 here, and `make test`'s jitter rerun too.
SAN_SHM_EXCLUDE = on 4 processes, equal to threads
SAN_EXCLUDE ?= host loop variant|attention twins hold|$(SAN_SHM_EXCLUDE)
sanitize: san-build
	@cd $(SAN_BUILD) && ctest --output-on-failure --timeout 600 -j $(JOBS) -L 'unit|multirank' \
	  -E '$(SAN_EXCLUDE)' $(CTEST_ARGS)

# Each fuzz target for FUZZ_SECONDS from its corpus (tests/fuzz/run.sh).
fuzz: san-build
	@tests/fuzz/run.sh $(SAN_BUILD) $(FUZZ_SECONDS)

# TSan: the multirank suite, its GEMMs on OpenBLAS (oneDNN's OpenMP pool and primitive cache are
# not instrumented: every 16-bit and f32 path forced off oneDNN). The build links the system's
# oneDNN (MESHRT_DNNL_ROOT empty), never called here: oneDNN 3.2's static initialisers crash
# under TSan in a process started with `ulimit -f 1` (SIGBUS in TSan's shadow of a strlen), which
# the file-size-limit tests of the tools suite do.
tsan: deps
	@cmake -S . -B $(TSAN_BUILD) $(call gen,$(TSAN_BUILD)) $(SAN_CMAKE) "-DCMAKE_CXX_FLAGS_DEBUG=-O1 $(TSAN_G)" \
	  "-DCMAKE_C_FLAGS_DEBUG=-O1 $(TSAN_G)" -DMESHRT_SANITIZE=thread \
	  -DMESHRT_HOST_ISA_VARIANTS=$(TSAN_ISA) -DMESHRT_DNNL_ROOT= $(LAUNCHER) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TARGETS)
	@cd $(TSAN_BUILD) && MESHRT_HOST_BF16_GEMM=f32 MESHRT_HOST_F16_GEMM=f32 MESHRT_HOST_F32_GEMM=openblas \
	  ctest --output-on-failure --timeout 600 -j $(JOBS) -L multirank -E '$(TSAN_EXCLUDE)' \
	  $(CTEST_ARGS)

# 2000 training steps under stream jitter: finite losses, flat allocator statistics.
soak: build
	@tools/soak.sh $(BUILD)

format:
	@git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(BENCH_BUILD) $(SAN_BUILD) $(TSAN_BUILD)
