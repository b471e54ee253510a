// Catch2 main of the kernels suite. A run that selects only [cuda] cases on a machine without a
// usable GPU prints why and exits 77, which ctest reports as skipped (tests/common/cuda_skip.h).
#define CATCH_CONFIG_RUNNER
#include "tests/common/cuda_skip.h"

int main(int argc, char** argv) { return meshrt::test::run_catch_or_skip(argc, argv); }
