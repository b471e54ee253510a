// Helpers for the collective tests: rank threads, exact input patterns and their reductions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/tensor.h"

namespace meshrt::test {

inline const std::shared_ptr<Allocator>& test_allocator() {
  static std::shared_ptr<Allocator> a = make_host_caching_allocator();
  return a;
}

inline Tensor host_tensor(int64_t n, DType dt) {
  return Tensor::empty(Shape{n}, dt, test_allocator());
}

// Small integers, exact in every dtype and in sums over up to 8 ranks: v in [-8, 8].
inline double pattern(uint64_t seed, int rank, int64_t i) {
  uint64_t h = static_cast<uint64_t>(i) * 7u + static_cast<uint64_t>(rank) * 13u + seed * 5u;
  return static_cast<double>(static_cast<int64_t>(h % 17u) - 8);
}

// Writes v into element i of a contiguous host buffer of dtype dt.
inline void store(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(static_cast<float>(v));
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
  }
}

inline double load(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(p)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

// Fills t[i] = pattern(seed, rank, offset + i).
inline void fill_pattern(const Tensor& t, uint64_t seed, int rank, int64_t offset = 0) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    store(t.data_ptr(), t.dtype(), i, pattern(seed, rank, offset + i));
  }
}

inline void fill_value(const Tensor& t, double v) {
  for (int64_t i = 0; i < t.numel(); ++i) store(t.data_ptr(), t.dtype(), i, v);
}

// The value a reduction over ranks 0..n-1 of pattern(seed, j, i) must produce, in dtype dt.
inline double reduced(DType dt, ReduceOp op, uint64_t seed, int n, int64_t i) {
  double acc = pattern(seed, 0, i);
  for (int j = 1; j < n; ++j) {
    double v = pattern(seed, j, i);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
    if (op == ReduceOp::Max) acc = std::max(acc, v);
    if (op == ReduceOp::Min) acc = std::min(acc, v);
  }
  if (op != ReduceOp::Avg) return acc;
  if (dt == DType::i32 || dt == DType::i64) {
    return static_cast<double>(static_cast<int64_t>(acc) / n);
  }
  float q = static_cast<float>(acc) / static_cast<float>(n);
  if (dt == DType::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(q));
  if (dt == DType::f16) return f16_bits_to_f32(f32_to_f16_bits(q));
  return q;
}

// Records failures from rank threads (Catch2 assertions are not thread-safe).
class Failures {
 public:
  void add(const std::string& s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (list_.size() < 20) list_.push_back(s);
    ++count_;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lk(mu_);
    return count_;
  }
  std::string str() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::ostringstream os;
    for (auto& s : list_) os << s << "\n";
    if (count_ > list_.size()) os << "... " << count_ - list_.size() << " more\n";
    return os.str();
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
  size_t count_ = 0;
};

// Compares n elements of `got` against expect(i); records at most a few mismatches.
template <class Expect>
bool check_values(Failures& f, const std::string& what, const Tensor& got, int64_t offset,
                  int64_t n, Expect expect) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    double g = load(got.data_ptr(), got.dtype(), offset + i);
    double e = expect(i);
    if (!(g == e || (std::isnan(g) && std::isnan(e)))) {
      if (bad++ < 3) {
        std::ostringstream os;
        os << what << ": element " << i << " = " << g << ", expected " << e;
        f.add(os.str());
      }
    }
  }
  return bad == 0;
}

// Runs fn(rank) on one thread per communicator; returns each rank's error ("" when none).
// A rank that throws aborts its communicator so that the others fail fast instead of waiting.
inline std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
                                          const std::function<void(int)>& fn,
                                          bool abort_on_error = true) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(static_cast<int>(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (abort_on_error && comms[r])
          comms[r]->abort(std::string("test rank failed: ") + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string join_errors(const std::vector<std::string>& errs) {
  std::ostringstream os;
  for (size_t r = 0; r < errs.size(); ++r) {
    if (!errs[r].empty()) os << "rank " << r << ": " << errs[r] << "\n";
  }
  return os.str();
}

}  // namespace meshrt::test
