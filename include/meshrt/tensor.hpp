// meshrt's public C++ API: errors, the handle wrapper, tensors. Header-only value types over the
// C API's handles (meshrt/meshrt.h), so both surfaces run on the one core capi/ implements; see
// meshrt.h for every call's contract. Include <meshrt/comm.hpp>, <meshrt/mesh.hpp> or
// <meshrt/blocks.hpp> (each includes what it needs). The names live in the inline namespace
// meshrt::api_v1 (written meshrt::Tensor), which changes with an incompatible change of this API.
#ifndef MESHRT_TENSOR_HPP_
#define MESHRT_TENSOR_HPP_

#include <meshrt/meshrt.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace meshrt {
inline namespace api_v1 {

// A failed call: what() is "<call>: <status>: <meshrt_last_error()>" (what failed, the values,
// what to change); status() the C status.
class Error : public std::runtime_error {
 public:
  Error(meshrt_status_t status, const std::string& what)
      : std::runtime_error(what), status_(status) {}
  meshrt_status_t status() const noexcept { return status_; }

 private:
  meshrt_status_t status_;
};

// Throws Error when `status` is not MESHRT_SUCCESS; `call` names the C call.
inline void check(meshrt_status_t status, const char* call) {
  if (status != MESHRT_SUCCESS) {
    throw Error(status, std::string(call) + ": " + meshrt_status_string(status) + ": " +
                            meshrt_last_error());
  }
}

// meshrt_init(MESHRT_API_VERSION): the objects below call it before their first C call, so a
// program never has to (calling it again is harmless).
inline void init() { check(meshrt_init(MESHRT_API_VERSION), "meshrt_init"); }

namespace detail {

// Owns one C handle: move-only, destroyed with `Destroy` (which waits for its work) unless
// released.
template <class H, meshrt_status_t (*Destroy)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) noexcept : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  H get() const noexcept { return h_; }
  H release() noexcept { return std::exchange(h_, nullptr); }
  void reset() noexcept {
    if (h_) (void)Destroy(h_);
    h_ = nullptr;
  }
  explicit operator bool() const noexcept { return h_ != nullptr; }

 private:
  H h_ = nullptr;
};

template <class T>
DLDataType dl_dtype();
template <>
inline DLDataType dl_dtype<float>() {
  return DLDataType{kDLFloat, 32, 1};
}
template <>
inline DLDataType dl_dtype<int32_t>() {
  return DLDataType{kDLInt, 32, 1};
}
template <>
inline DLDataType dl_dtype<int64_t>() {
  return DLDataType{kDLInt, 64, 1};
}

}  // namespace detail

// A tensor handle (meshrt_tensor_t): a view of the engine's memory (borrowed, zero copy) or memory
// meshrt allocated. Move-only; the handle is released on destruction while the memory lives on as
// long as queued work uses it (meshrt_tensor_destroy).
class Tensor {
 public:
  Tensor() = default;
  // Takes ownership of a C handle.
  explicit Tensor(meshrt_tensor_t h) noexcept : h_(h) {}

  // Borrows a DLTensor's memory (meshrt_tensor_from_dltensor): it must outlive every use.
  static Tensor borrow(const DLTensor& t) {
    init();
    meshrt_tensor_t h = nullptr;
    check(meshrt_tensor_from_dltensor(&t, &h), "meshrt_tensor_from_dltensor");
    return Tensor(h);
  }
  // Borrows a contiguous CPU array of float, int32_t or int64_t with `shape`.
  template <class T>
  static Tensor borrow_cpu(T* data, std::vector<int64_t> shape) {
    DLTensor t{};
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = detail::dl_dtype<T>();
    t.shape = shape.data();
    return borrow(t);
  }
  // Takes over a DLManagedTensor (its deleter runs once meshrt lets go).
  static Tensor adopt(DLManagedTensor* t) {
    init();
    meshrt_tensor_t h = nullptr;
    check(meshrt_tensor_from_dlpack(t, &h), "meshrt_tensor_from_dlpack");
    return Tensor(h);
  }
  // A DLPack view for the engine (meshrt_tensor_to_dlpack): call its deleter when done.
  DLManagedTensor* to_dlpack() const {
    DLManagedTensor* out = nullptr;
    check(meshrt_tensor_to_dlpack(h_.get(), &out), "meshrt_tensor_to_dlpack");
    return out;
  }

  meshrt_tensor_t get() const noexcept { return h_.get(); }
  meshrt_tensor_t release() noexcept { return h_.release(); }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  detail::Handle<meshrt_tensor_t, meshrt_tensor_destroy> h_;
};

}  // namespace api_v1
}  // namespace meshrt

#endif  // MESHRT_TENSOR_HPP_
