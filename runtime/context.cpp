#include "runtime/context.h"

#include "runtime/backend.h"
#include "runtime/error.h"

namespace meshrt {

Context::Context(Device device, ContextOptions opts) : device_(device), opts_(std::move(opts)) {
  MESHRT_CHECK(opts_.world_size >= 1 && opts_.rank >= 0 && opts_.rank < opts_.world_size,
               "Context: rank " << opts_.rank << " not in world of size " << opts_.world_size);
  MESHRT_CHECK(opts_.local_ranks >= 1, "Context: local_ranks " << opts_.local_ranks << " < 1");
  const DeviceRuntime& be = backend_for(device);
  alloc_ = opts_.allocator ? opts_.allocator : be.create_caching_allocator(device.index);
  MESHRT_CHECK(alloc_->device() == device, "Context on " << device.str() << " given allocator '"
                                                         << alloc_->name() << "' for "
                                                         << alloc_->device().str());
  host_alloc_ = device.is_cpu() ? alloc_ : make_host_caching_allocator(0);
  compute_ = opts_.external_stream ? be.wrap_stream(device.index, opts_.external_stream, "compute")
                                   : be.create_stream(device.index, "compute");
}

Context::~Context() {
  try {
    synchronize();
  } catch (...) {
    // errors were reported to whoever waited; the destructor must not throw
  }
  streams_.clear();
  compute_.reset();
  // Upper-layer state (BLAS / cuBLASLt handles) goes in reverse order of creation.
  for (auto it = state_order_.rbegin(); it != state_order_.rend(); ++it) state_.erase(*it);
}

Stream& Context::stream(const std::string& name) {
  std::lock_guard<std::mutex> lk(streams_mu_);
  auto it = streams_.find(name);
  if (it == streams_.end())
    it = streams_.emplace(name, backend_for(device_).create_stream(device_.index, name)).first;
  return *it->second;
}

Tensor Context::empty(const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, alloc_, compute_.get());
}

Tensor Context::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.zero_(*compute_);
  return t;
}

void Context::synchronize() {
  compute_->synchronize();
  std::lock_guard<std::mutex> lk(streams_mu_);
  for (auto& [name, s] : streams_) s->synchronize();
}

}  // namespace meshrt
