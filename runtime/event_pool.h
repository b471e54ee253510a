// HandlePool: a free list of reusable backend handles (CUDA events), so that recording an event
// does not create one each time; internal to runtime/.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace meshrt {

// acquire() hands out a released handle or creates one; release() takes it back for reuse; the
// pool destroys the handles it holds when it is destroyed (hold it by shared_ptr from every
// handed-out handle's owner, so that it outlives them). Thread-safe.
template <class H>
class HandlePool {
 public:
  HandlePool(std::function<H()> create, std::function<void(H)> destroy)
      : create_(std::move(create)), destroy_(std::move(destroy)) {}
  ~HandlePool() {
    for (H h : free_) destroy_(h);
  }
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;

  H acquire() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_.empty()) {
        H h = free_.back();
        free_.pop_back();
        return h;
      }
      ++created_;
    }
    return create_();  // outside the lock: creation may be slow
  }
  void release(H h) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(h);
  }
  // Handles created so far / held for reuse now.
  size_t created() const {
    std::lock_guard<std::mutex> lk(mu_);
    return created_;
  }
  size_t idle() const {
    std::lock_guard<std::mutex> lk(mu_);
    return free_.size();
  }

 private:
  std::function<H()> create_;
  std::function<void(H)> destroy_;
  mutable std::mutex mu_;
  std::vector<H> free_;
  size_t created_ = 0;
};

}  // namespace meshrt
