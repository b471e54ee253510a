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
#include "collectives/exact_values.h"
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

using exact::load;
using exact::pattern;
using exact::store;

// Fills t[i] = pattern(seed, rank, offset + i).
inline void fill_pattern(const Tensor& t, uint64_t seed, int rank, int64_t offset = 0) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    store(t.data_ptr(), t.dtype(), i, pattern(seed, rank, offset + i));
  }
}

inline void fill_value(const Tensor& t, double v) {
  for (int64_t i = 0; i < t.numel(); ++i) store(t.data_ptr(), t.dtype(), i, v);
}

using exact::reduced;

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
