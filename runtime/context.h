// Context: one rank's device, compute stream, side streams, allocator and per-layer state.
#pragma once

#include <any>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "meshrt/export.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt {

struct MESHRT_API ContextOptions {
  int rank = 0;
  int world_size = 1;
  // Engine-provided allocator; default: the backend's caching allocator.
  std::shared_ptr<Allocator> allocator;
  // Engine-provided native compute stream (cudaStream_t); default: a new stream.
  void* external_stream = nullptr;
  // Host ranks sharing the machine, used to size BLAS threads (cores / local ranks).
  int local_ranks = 1;
};

class MESHRT_API Context {
 public:
  explicit Context(Device device, ContextOptions opts = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  int rank() const { return opts_.rank; }
  int world_size() const { return opts_.world_size; }
  int local_ranks() const { return opts_.local_ranks; }
  Stream& compute_stream() { return *compute_; }
  // A named side stream (e.g. "comm.tp"), created on first use and owned by the context.
  Stream& stream(const std::string& name);
  Allocator& allocator() { return *alloc_; }
  const std::shared_ptr<Allocator>& allocator_ptr() const { return alloc_; }
  // Host allocator for staging and host-side results (the allocator itself on CPU).
  const std::shared_ptr<Allocator>& host_allocator() const { return host_alloc_; }

  Tensor empty(const Shape& shape, DType dtype);
  Tensor zeros(const Shape& shape, DType dtype);
  // Waits for the compute stream and every side stream.
  void synchronize();

  // Per-rank state of upper layers (BLAS / cuBLASLt handles, plan caches), one object per type:
  // T, usually a struct private to its layer, is its own key, so two layers cannot collide on a
  // name. Created by `make` on first use, destroyed with the context in reverse order of creation.
  template <class T>
  T& state(const std::function<std::shared_ptr<T>()>& make) {
    std::lock_guard<std::mutex> lk(state_mu_);
    const std::type_index key(typeid(T));
    auto it = state_.find(key);
    if (it == state_.end()) {
      std::shared_ptr<T> v = make();
      state_order_.push_back(key);
      it = state_.emplace(key, std::shared_ptr<void>(v)).first;
    }
    return *static_cast<T*>(it->second.get());
  }

 private:
  Device device_;
  ContextOptions opts_;
  std::shared_ptr<Allocator> alloc_;
  std::shared_ptr<Allocator> host_alloc_;
  std::unique_ptr<Stream> compute_;
  std::mutex streams_mu_;
  std::map<std::string, std::unique_ptr<Stream>> streams_;
  std::mutex state_mu_;
  std::map<std::type_index, std::shared_ptr<void>> state_;
  std::vector<std::type_index> state_order_;
};

}  // namespace meshrt
