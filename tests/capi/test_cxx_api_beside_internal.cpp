// One translation unit with both meshrt::Tensor / Stream / Event / Error: the library's internal
// types (runtime/) and the public C++ API's (meshrt/meshrt.hpp, namespace meshrt::api_v1). The
// internal headers come first: the public headers' using-directive makes api_v1's names
// meshrt::Tensor, ... only where meshrt declares no type of the same name, so here
// meshrt::Tensor stays the internal one and the public types are named meshrt::api_v1::Tensor.
#include <catch2/catch.hpp>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

#include <meshrt/meshrt.hpp>

static_assert(!std::is_same_v<meshrt::Tensor, meshrt::api_v1::Tensor>);
static_assert(!std::is_same_v<meshrt::Stream, meshrt::api_v1::Stream>);
static_assert(!std::is_same_v<meshrt::Event, meshrt::api_v1::Event>);
static_assert(!std::is_same_v<meshrt::Error, meshrt::api_v1::Error>);
// The internal meshrt::Tensor is the runtime's (it has a Shape), the public one wraps a C handle.
static_assert(
    std::is_same_v<decltype(std::declval<meshrt::Tensor>().shape()), const meshrt::Shape&>);
static_assert(
    std::is_same_v<decltype(std::declval<meshrt::api_v1::Tensor>().get()), meshrt_tensor_t>);

TEST_CASE("cxx api beside internal: one file uses both Tensor and Error types", "[capi]") {
  std::vector<float> host = {1.f, 2.f, 3.f};
  const meshrt::Tensor inner =
      meshrt::Tensor::from_host_data(host.data(), meshrt::Shape{3}, meshrt::DType::f32);
  CHECK(inner.numel() == 3);

  meshrt::api_v1::Tensor outer = meshrt::api_v1::Tensor::borrow_cpu(host.data(), {3});
  CHECK(static_cast<bool>(outer));

  // Each Error is caught as its own type.
  try {
    throw meshrt::Error("internal");
  } catch (const meshrt::api_v1::Error&) {
    FAIL("the internal Error was caught as the public one");
  } catch (const meshrt::Error& e) {
    CHECK(std::string(e.what()) == "internal");
  }
}
