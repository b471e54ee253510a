// Helpers of the C API tests: engine-owned DLPack buffers, rank threads, status assertions.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
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

namespace capi_test {

// Deterministic values in about [-scale, scale], the same on every rank.
inline double val(uint64_t seed, int64_t i, double scale) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 31;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 29;
  return scale * (static_cast<double>(z % 20001) / 10000.0 - 1.0);
}

// Max |got - want| / max(1, max |want|); throws naming the tensor when above tol.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<double>& want, const char* what,
                  const std::string& where, double tol = 1e-4) {
  if (got.size() != want.size())
    throw std::runtime_error(where + ": " + what + " has " + std::to_string(got.size()) +
                             " elements, expected " + std::to_string(want.size()));
  double err = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  if (err / scale > tol)
    throw std::runtime_error(where + ": " + what + " relative error " +
                             std::to_string(err / scale) + " > " + std::to_string(tol));
}

inline std::vector<double> scaled(std::vector<double> v, double s) {
  for (double& x : v) x *= s;
  return v;
}

// n thread ranks of one process (meshrt_comm_init_all), destroyed with the object.
struct World {
  explicit World(int n, double timeout_s = 60) : comms(static_cast<size_t>(n)) {
    init_api();
    const meshrt_comm_config_t cfg = test_config(timeout_s);
    if (meshrt_comm_init_all(comms.data(), n, nullptr, &cfg) != MESHRT_SUCCESS)
      throw std::runtime_error(meshrt_last_error());
  }
  ~World() {
    for (meshrt_comm_t c : comms) meshrt_comm_destroy(c);
  }
  std::vector<meshrt_comm_t> comms;
};

// A contiguous n-D CPU tensor of any float dtype the engine owns, with its borrowed handle;
// values go in and out as doubles.
class Mat {
 public:
  Mat(std::vector<int64_t> shape, DLDataType dt) : shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t e : shape_) n *= e;
    buf_ = std::make_unique<Buf>(dt, n);
    dl_ = *buf_->dl();
    dl_.ndim = static_cast<int>(shape_.size());
    dl_.shape = shape_.data();
    if (meshrt_tensor_from_dltensor(&dl_, &h) != MESHRT_SUCCESS)
      throw std::runtime_error(meshrt_last_error());
  }
  ~Mat() { meshrt_tensor_destroy(h); }
  Mat(const Mat&) = delete;
  Mat& operator=(const Mat&) = delete;
  int64_t size() const { return buf_->size(); }
  void load(const std::vector<double>& v) {
    for (size_t i = 0; i < v.size(); ++i) buf_->set(static_cast<int64_t>(i), v[i]);
  }
  std::vector<double> values() const {
    std::vector<double> out(static_cast<size_t>(size()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = buf_->get(static_cast<int64_t>(i));
    return out;
  }
  meshrt_tensor_t h = nullptr;

 private:
  std::vector<int64_t> shape_;
  std::unique_ptr<Buf> buf_;
  DLTensor dl_{};
};

// LayerNorm (or RMSNorm: no mean, no beta) of one row in double: n = normalised, out = n * gamma
// + beta; returns rstd.
inline double norm_row(const double* x, int64_t h, const std::vector<double>& gamma,
                       const std::vector<double>& beta, bool layernorm, double eps,
                       std::vector<double>& n, std::vector<double>& out) {
  double mean = 0, ms = 0;
  if (layernorm)
    for (int64_t i = 0; i < h; ++i) mean += x[i] / static_cast<double>(h);
  for (int64_t i = 0; i < h; ++i) ms += (x[i] - mean) * (x[i] - mean) / static_cast<double>(h);
  const double rstd = 1 / std::sqrt(ms + eps);
  n.resize(static_cast<size_t>(h));
  out.resize(static_cast<size_t>(h));
  for (int64_t i = 0; i < h; ++i) {
    const auto k = static_cast<size_t>(i);
    n[k] = (x[i] - mean) * rstd;
    out[k] = n[k] * gamma[k] + (layernorm ? beta[k] : 0.0);
  }
  return rstd;
}

// Backward of norm_row for d(out) = dout: adds to ggamma / gbeta, writes dx (h values).
inline void norm_row_backward(const std::vector<double>& dout, const std::vector<double>& n,
                              double rstd, const std::vector<double>& gamma, bool layernorm,
                              std::vector<double>& ggamma, std::vector<double>& gbeta, double* dx) {
  const size_t h = n.size();
  double mdn = 0, mdnn = 0;
  std::vector<double> dn(h);
  for (size_t k = 0; k < h; ++k) {
    ggamma[k] += dout[k] * n[k];
    gbeta[k] += dout[k];
    dn[k] = dout[k] * gamma[k];
    mdn += dn[k] / static_cast<double>(h);
    mdnn += dn[k] * n[k] / static_cast<double>(h);
  }
  if (!layernorm) mdn = 0;
  for (size_t k = 0; k < h; ++k) dx[k] = rstd * (dn[k] - mdn - n[k] * mdnn);
}

// ---- 2 forked processes (the file / TCP rendezvous tests, attention under cp on shm) ----

inline std::string fresh_dir(const char* tag) {
  auto d = std::filesystem::temp_directory_path() /
           (std::string("meshrt-capi-") + tag + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// Runs body in a forked child that never returns to Catch; the parent gets its pid. Both ranks
// are forked from this (single) thread: a fork while another thread of the parent holds a lock
// (the allocator's, a sanitizer's) leaves that lock held forever in the child.
inline pid_t spawn_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    int rc = 100;
    try {
      rc = body();
    } catch (...) {
      rc = 101;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  return pid;
}

// The child's exit code; 200 when it did not exit normally, 201 when fork failed.
inline int wait_child(pid_t pid) {
  if (pid < 0) return 201;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200;
}

// Runs both ranks of a 2-process world as children; returns their exit codes.
inline std::pair<int, int> run_two_ranks(const std::function<int(int)>& rank_body) {
  const pid_t p1 = spawn_child([&] { return rank_body(1); });
  const pid_t p0 = spawn_child([&] { return rank_body(0); });
  const int rc0 = wait_child(p0);
  return {rc0, wait_child(p1)};
}

}  // namespace capi_test
