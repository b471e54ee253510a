// cuBLASLt algorithm selection logic (kernels/gemm_algos.h) on the CPU, with fake candidates.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kernels/gemm_algos.h"

using namespace meshrt::kernels;
using Catch::Matchers::Contains;

TEST_CASE("gemm algos: unusable heuristic results are dropped, the order kept", "[unit]") {
  const std::vector<AlgoCandidate> c = {
      {false, "CUBLAS_STATUS_NOT_SUPPORTED"}, {true, ""}, {false, "X"}, {true, ""}, {true, ""}};
  CHECK(usable_algos(c, "p") == std::vector<int>{1, 3, 4});
}

TEST_CASE("gemm algos: no usable result names the problem and every state", "[unit]") {
  const std::string p = gemm_problem_str(7, 9, 33, 2, true, false, "bf16", "f32", "bf16");
  CHECK(p == "m=7 n=9 k=33 batch=2 bf16 x bf16 -> f32 + bias bf16, A transposed");
  const std::vector<AlgoCandidate> c = {{false, "CUBLAS_STATUS_NOT_SUPPORTED"},
                                        {false, "CUBLAS_STATUS_INVALID_VALUE"}};
  CHECK_THROWS_WITH(usable_algos(c, p), Contains("m=7 n=9 k=33 batch=2 bf16 x bf16 -> f32") &&
                                            Contains("#0 CUBLAS_STATUS_NOT_SUPPORTED") &&
                                            Contains("#1 CUBLAS_STATUS_INVALID_VALUE"));
  CHECK_THROWS_WITH(usable_algos({}, p), Contains("none returned"));
}

TEST_CASE("gemm algos: falls back in order and remembers the one that ran", "[unit]") {
  const std::vector<int> order = {4, 2, 7};
  std::vector<int> tried;
  auto fails_until_7 = [&](int a) -> std::string {
    tried.push_back(a);
    return a == 7 ? "" : "CUBLAS_STATUS_NOT_SUPPORTED";
  };
  CHECK(run_with_fallback(order, 0, fails_until_7, "p") == 2);
  CHECK(tried == std::vector<int>{4, 2, 7});
  // Next call starts at the remembered position: no retry of the failed ones.
  tried.clear();
  CHECK(run_with_fallback(order, 2, fails_until_7, "p") == 2);
  CHECK(tried == std::vector<int>{7});
  // The first that runs wins; later ones are not tried.
  tried.clear();
  CHECK(run_with_fallback(
            order, 0,
            [&](int a) -> std::string {
              tried.push_back(a);
              return "";
            },
            "p") == 0);
  CHECK(tried == std::vector<int>{4});
}

TEST_CASE("gemm algos: every candidate failing names the problem and each failure", "[unit]") {
  auto all_fail = [](int a) {
    return std::string("CUBLAS_STATUS_EXECUTION_FAILED#") + char('0' + a);
  };
  CHECK_THROWS_WITH(run_with_fallback({3, 1}, 0, all_fail, "m=1 n=2 k=3 batch=1 f16 x f16 -> f16"),
                    Contains("m=1 n=2 k=3 batch=1 f16 x f16 -> f16") &&
                        Contains("algorithm #3 CUBLAS_STATUS_EXECUTION_FAILED#3") &&
                        Contains("algorithm #1 CUBLAS_STATUS_EXECUTION_FAILED#1"));
}

TEST_CASE("gemm algos: bias below 16-byte alignment goes to a separate kernel", "[unit]") {
  alignas(64) static char buf[128];
  CHECK(bias_in_epilogue(buf));
  CHECK(bias_in_epilogue(buf + 16));
  CHECK_FALSE(bias_in_epilogue(buf + 2));
  CHECK_FALSE(bias_in_epilogue(buf + 8));
  CHECK_FALSE(bias_in_epilogue(nullptr));
}
