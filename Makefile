# meshrt: `make test` (deps, configure, build, all CPU tests) and `make bench` (Release build,
# the main benchmark). Variables: BUILD (build dir), CUDA (AUTO|ON|OFF), JOBS, CMAKE_ARGS.
BUILD ?= build
BENCH_BUILD ?= build-release
CUDA ?= AUTO
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
CTEST_ARGS ?=

.PHONY: all deps configure build test bench format clean

all: build

deps:
	@tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DMESHRT_CUDA=$(CUDA) -DMESHRT_WERROR=ON $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# CPU tests: every label but cuda (cuda cases also skip themselves without a GPU).
test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -j $(JOBS) $(CTEST_ARGS)

bench: deps
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DMESHRT_CUDA=$(CUDA) \
	  -DMESHRT_BUILD_TESTS=OFF $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS)
	@tools/bench-default.sh $(BENCH_BUILD)

format:
	@git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(BENCH_BUILD)
