// Helpers of the C API tests: engine-owned DLPack buffers, rank threads, status assertions.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "meshrt/meshrt.h"
#include "runtime/half.h"

namespace capi_test {

// Asserts a C call's status; on a mismatch shows the thread's last error.
#define CAPI_REQUIRE_OK(call)                                                          \
  do {                                                                                 \
    const meshrt_status_t st_ = (call);                                                \
    INFO(#call << " -> " << meshrt_status_string(st_) << ": " << meshrt_last_error()); \
    REQUIRE(st_ == MESHRT_SUCCESS);                                                    \
  } while (0)

// The status of `call` is `expect` and meshrt_last_error() contains every string in `parts`.
inline void require_status(meshrt_status_t got, meshrt_status_t expect,
                           std::vector<std::string> parts) {
  const std::string msg = meshrt_last_error();
  INFO("status " << meshrt_status_string(got) << ", last error: " << msg);
  REQUIRE(got == expect);
  for (const auto& p : parts) {
    INFO("expected in the message: " << p);
    CHECK(msg.find(p) != std::string::npos);
  }
}

inline DLDataType dl_dtype(uint8_t code, uint8_t bits) {
  DLDataType d;
  d.code = code;
  d.bits = bits;
  d.lanes = 1;
  return d;
}

struct DtypeCase {
  const char* name;
  DLDataType dt;
};
inline std::vector<DtypeCase> all_dtypes() {
  return {{"f32", dl_dtype(kDLFloat, 32)},
          {"bf16", dl_dtype(kDLBfloat, 16)},
          {"f16", dl_dtype(kDLFloat, 16)},
          {"i32", dl_dtype(kDLInt, 32)},
          {"i64", dl_dtype(kDLInt, 64)}};
}

// A 1-D CPU buffer the "engine" owns, seen by meshrt through a borrowed DLTensor.
class Buf {
 public:
  Buf(DLDataType dt, int64_t n) : dt_(dt), n_(n), bytes_(static_cast<size_t>(n) * dt.bits / 8) {
    shape_[0] = n;
    dl_.data = bytes_.data();
    dl_.device.device_type = kDLCPU;
    dl_.device.device_id = 0;
    dl_.ndim = 1;
    dl_.dtype = dt;
    dl_.shape = shape_;
    dl_.strides = nullptr;
    dl_.byte_offset = 0;
  }
  ~Buf() { meshrt_tensor_destroy(h_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  int64_t size() const { return n_; }
  DLTensor* dl() { return &dl_; }
  meshrt_tensor_t handle() {
    if (!h_) {
      const meshrt_status_t st = meshrt_tensor_from_dltensor(&dl_, &h_);
      if (st != MESHRT_SUCCESS) throw std::runtime_error(meshrt_last_error());
    }
    return h_;
  }
  void set(int64_t i, double v) {
    char* p = bytes_.data();
    if (dt_.code == kDLFloat && dt_.bits == 32) reinterpret_cast<float*>(p)[i] = float(v);
    if (dt_.code == kDLFloat && dt_.bits == 16)
      reinterpret_cast<meshrt::f16*>(p)[i] = meshrt::f16::from_float(float(v));
    if (dt_.code == kDLBfloat)
      reinterpret_cast<meshrt::bf16*>(p)[i] = meshrt::bf16::from_float(float(v));
    if (dt_.code == kDLInt && dt_.bits == 32) reinterpret_cast<int32_t*>(p)[i] = int32_t(v);
    if (dt_.code == kDLInt && dt_.bits == 64) reinterpret_cast<int64_t*>(p)[i] = int64_t(v);
  }
  double get(int64_t i) const {
    const char* p = bytes_.data();
    if (dt_.code == kDLFloat && dt_.bits == 32) return reinterpret_cast<const float*>(p)[i];
    if (dt_.code == kDLFloat && dt_.bits == 16)
      return reinterpret_cast<const meshrt::f16*>(p)[i].to_float();
    if (dt_.code == kDLBfloat) return reinterpret_cast<const meshrt::bf16*>(p)[i].to_float();
    if (dt_.code == kDLInt && dt_.bits == 32) return reinterpret_cast<const int32_t*>(p)[i];
    return double(reinterpret_cast<const int64_t*>(p)[i]);
  }

 private:
  DLDataType dt_;
  int64_t n_;
  std::vector<char> bytes_;
  int64_t shape_[1];
  DLTensor dl_{};
  meshrt_tensor_t h_ = nullptr;
};

// Runs fn(rank) on n threads; rethrows the first failure (Catch assertions are not thread-safe,
// so rank threads throw std::runtime_error and the main thread reports it).
inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

// In rank threads: throws with the call, its status and message unless it succeeded.
#define CAPI_THROW_UNLESS_OK(call)                                                              \
  do {                                                                                          \
    const meshrt_status_t st_ = (call);                                                         \
    if (st_ != MESHRT_SUCCESS)                                                                  \
      throw std::runtime_error(std::string(#call) + " -> " + meshrt_status_string(st_) + ": " + \
                               meshrt_last_error());                                            \
  } while (0)

#define RANK_EXPECT(cond, what)                                                              \
  do {                                                                                       \
    if (!(cond)) throw std::runtime_error(std::string("expected ") + #cond + ": " + (what)); \
  } while (0)

inline meshrt_comm_config_t test_config(double timeout_s = 60) {
  meshrt_comm_config_t c = MESHRT_COMM_CONFIG_INITIALIZER;
  c.timeout_s = timeout_s;
  c.init_timeout_s = timeout_s;
  return c;
}

inline void init_api() {
  const meshrt_status_t st = meshrt_init(MESHRT_API_VERSION);
  if (st != MESHRT_SUCCESS) throw std::runtime_error(meshrt_last_error());
}

}  // namespace capi_test
