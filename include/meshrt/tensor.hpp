// meshrt's public C++ API: errors, the handle wrapper, tensors. Header-only value types over the
// C API's handles (meshrt/meshrt.h), so both surfaces run on the one core capi/ implements; see
// meshrt.h for every call's contract. Include <meshrt/comm.hpp>, <meshrt/mesh.hpp> or
// <meshrt/blocks.hpp> (each includes what it needs). The names live in the namespace
// meshrt::api_v1, which changes with an incompatible change of this API; a using-directive makes
// them meshrt::Tensor, meshrt::Comm, ... in code that does not also declare meshrt's internal
// types of the same names.
#ifndef MESHRT_TENSOR_HPP_
#define MESHRT_TENSOR_HPP_

#include <meshrt/meshrt.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace meshrt {
namespace api_v1 {

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
// program never has to (calling it again is harmless). It runs until it succeeds once (it checks
// the MESHRT_ environment variables; every communicator init checks them again).
inline void init() {
  static std::atomic<bool> done{false};
  if (done.load(std::memory_order_acquire)) return;
  check(meshrt_init(MESHRT_API_VERSION), "meshrt_init");
  done.store(true, std::memory_order_release);
}

namespace detail {

// One C handle: move-only. An owned handle is destroyed with `Destroy` (which waits for its work)
// when the object dies, unless released; a borrowed one (Handle::borrow: a handle someone else
// owns, such as a communicator's default stream or a mesh's communicator) never is.
template <class H, meshrt_status_t (*Destroy)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) noexcept : h_(h) {}
  static Handle borrow(H h) noexcept {
    Handle b(h);
    b.owned_ = false;
    return b;
  }
  Handle(Handle&& o) noexcept
      : h_(std::exchange(o.h_, nullptr)), owned_(std::exchange(o.owned_, true)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
      owned_ = std::exchange(o.owned_, true);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  H get() const noexcept { return h_; }
  bool owned() const noexcept { return owned_; }
  H release() noexcept {
    owned_ = true;
    return std::exchange(h_, nullptr);
  }
  // Destroys an owned handle now, throwing the destroy's error (`call` names it); a borrowed one
  // is only let go.
  void destroy(const char* call) {
    const bool owned = owned_;
    H h = release();
    if (h && owned) check(Destroy(h), call);
  }
  void reset() noexcept {
    if (h_ && owned_) (void)Destroy(h_);
    h_ = nullptr;
    owned_ = true;
  }
  explicit operator bool() const noexcept { return h_ != nullptr; }

 private:
  H h_ = nullptr;
  bool owned_ = true;
};

// The DLPack dtype of a C++ element type borrow_cpu takes (supported = false for the others).
template <class T>
struct DlType {
  static constexpr bool supported = false;
};
template <>
struct DlType<float> {
  static constexpr bool supported = true;
  static DLDataType get() noexcept { return DLDataType{kDLFloat, 32, 1}; }
};
template <>
struct DlType<int32_t> {
  static constexpr bool supported = true;
  static DLDataType get() noexcept { return DLDataType{kDLInt, 32, 1}; }
};
template <>
struct DlType<int64_t> {
  static constexpr bool supported = true;
  static DLDataType get() noexcept { return DLDataType{kDLInt, 64, 1}; }
};
template <>
struct DlType<uint8_t> {
  static constexpr bool supported = true;
  static DLDataType get() noexcept { return DLDataType{kDLUInt, 8, 1}; }
};

}  // namespace detail

// A tensor handle (meshrt_tensor_t): a view of the engine's memory (borrowed, zero copy) or memory
// meshrt allocated. Move-only; the handle is released on destruction while the memory lives on as
// long as queued work uses it (meshrt_tensor_destroy).
class Tensor {
 public:
  Tensor() = default;
  // Takes ownership of a C handle.
  explicit Tensor(meshrt_tensor_t h) noexcept : h_(h) {}

  // Borrows a DLTensor's memory (meshrt_tensor_from_dltensor): the memory must outlive every
  // use; the DLTensor itself (its shape and strides arrays) is copied, and may go at once.
  static Tensor borrow(const DLTensor& t) {
    init();
    meshrt_tensor_t h = nullptr;
    check(meshrt_tensor_from_dltensor(&t, &h), "meshrt_tensor_from_dltensor");
    return Tensor(h);
  }
  // Borrows a contiguous CPU array of float, int32_t, int64_t or uint8_t (data movement only)
  // with `shape`. Another T does not compile, naming these; so does a pointer to const: meshrt
  // may write a borrowed tensor (a collective's output), so it takes writable memory only.
  template <class T>
  static Tensor borrow_cpu(T* data, std::vector<int64_t> shape) {
    static_assert(!std::is_const<T>::value,
                  "meshrt::Tensor::borrow_cpu takes a pointer to writable memory (T*, not const "
                  "T*): meshrt may write a borrowed tensor; copy read-only data first");
    static_assert(detail::DlType<typename std::remove_const<T>::type>::supported,
                  "meshrt::Tensor::borrow_cpu<T>: T must be float, int32_t, int64_t or uint8_t "
                  "(bfloat16 / float16 data: fill a DLTensor and call Tensor::borrow)");
    if constexpr (!std::is_const<T>::value && detail::DlType<T>::supported) {
      DLTensor t{};
      t.data = data;
      t.device.device_type = kDLCPU;
      t.ndim = static_cast<int32_t>(shape.size());
      t.dtype = detail::DlType<T>::get();
      t.shape = shape.data();
      return borrow(t);
    } else {
      return Tensor();  // not reached: the static_asserts above stop the compile
    }
  }
  // Takes over a DLManagedTensor (its deleter runs once meshrt lets go); on failure the caller
  // still owns it.
  static Tensor adopt(DLManagedTensor* t) {
    init();
    meshrt_tensor_t h = nullptr;
    check(meshrt_tensor_from_dlpack(t, &h), "meshrt_tensor_from_dlpack");
    return Tensor(h);
  }
  // The same for DLPack 1.0's DLManagedTensorVersioned (a read-only one may only be read).
  static Tensor adopt(::DLManagedTensorVersioned* t) {
    init();
    meshrt_tensor_t h = nullptr;
    check(meshrt_tensor_from_dlpack_versioned(t, &h), "meshrt_tensor_from_dlpack_versioned");
    return Tensor(h);
  }
  // A DLPack view for the engine (meshrt_tensor_to_dlpack): call its deleter when done.
  DLManagedTensor* to_dlpack() const {
    DLManagedTensor* out = nullptr;
    check(meshrt_tensor_to_dlpack(h_.get(), &out), "meshrt_tensor_to_dlpack");
    return out;
  }
  // The same as DLPack 1.0's versioned tensor (meshrt_tensor_to_dlpack_versioned).
  ::DLManagedTensorVersioned* to_dlpack_versioned() const {
    ::DLManagedTensorVersioned* out = nullptr;
    check(meshrt_tensor_to_dlpack_versioned(h_.get(), &out), "meshrt_tensor_to_dlpack_versioned");
    return out;
  }

  meshrt_tensor_t get() const noexcept { return h_.get(); }
  // Gives up ownership: the caller destroys the returned handle (meshrt_tensor_destroy).
  meshrt_tensor_t release() noexcept { return h_.release(); }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  detail::Handle<meshrt_tensor_t, meshrt_tensor_destroy> h_;
};

}  // namespace api_v1
// meshrt::Tensor, meshrt::Comm, ... in user code: api_v1 is a namespace of its own (not
// inline), so a file that also includes the library's internal headers (whose meshrt::Tensor,
// Stream, Event and Error are other types) compiles, and names these meshrt::api_v1::Tensor.
using namespace api_v1;
}  // namespace meshrt

#endif  // MESHRT_TENSOR_HPP_
