// Compiled by ctest (capi.cxx_borrow_cpu.*) with -DCASE_DOUBLE or -DCASE_CONST, expecting the
// compile to fail with borrow_cpu's own message, not a link error or a cryptic one.
#include <meshrt/tensor.hpp>

#include <vector>

void borrow() {
#if defined(CASE_DOUBLE)
  std::vector<double> v(4);
  (void)meshrt::Tensor::borrow_cpu(v.data(), {4});
#elif defined(CASE_CONST)
  const std::vector<float> v(4);
  (void)meshrt::Tensor::borrow_cpu(v.data(), {4});
#else
  std::vector<float> v(4);  // compiles
  (void)meshrt::Tensor::borrow_cpu(v.data(), {4});
#endif
}
