// Catch2 main of the kernels suite. When ctest runs a CUDA case (name starting "cuda ") and no
// GPU can be used, it prints why and exits 77, which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "runtime/backend.h"

int main(int argc, char** argv) {
  bool listing = false, cuda_only = argc > 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--list", 0) == 0 || a == "-l" || a == "-h" || a == "--help") listing = true;
    if (!a.empty() && a[0] == '-') continue;
    if (a.rfind("cuda ", 0) != 0 && a != "[cuda]") cuda_only = false;
  }
  std::string why;
  if (!listing && cuda_only && !meshrt::cuda_available(&why)) {
    std::printf("SKIPPED: no usable CUDA device: %s\n", why.c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
