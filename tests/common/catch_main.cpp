// The one Catch2 main() of every suite (the meshrt_catch_main object library): compiling Catch2's
// runner costs about 40 s per copy, once per build now instead of once per suite. Suites with GPU
// cases skip with 77 when no selected case can run (tests/common/cuda_skip.h).
#define CATCH_CONFIG_RUNNER
#include "tests/common/cuda_skip.h"

int main(int argc, char** argv) { return meshrt::test::run_catch_or_skip(argc, argv); }
