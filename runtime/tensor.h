// Tensor: a typed, strided view of shared storage on one device (host or CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshrt/export.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/shape.h"
#include "runtime/stream.h"
#include "runtime/tensor_desc.h"

namespace meshrt {

// Memory owned by an allocator (or by an external owner through a deleter, e.g. DLPack).
class MESHRT_API Storage {
 public:
  Storage(void* ptr, size_t bytes, Device device, std::shared_ptr<Allocator> alloc);
  Storage(void* ptr, size_t bytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return alloc_.get(); }
  const std::shared_ptr<Allocator>& allocator_ptr() const { return alloc_; }
  // Marks that this storage is used on `stream` (stream-aware reuse on free).
  void record_stream(Stream& stream);
  // A handle on this storage's memory that frees nothing (Tensor::stream_ref). It remembers the
  // allocator only so that keep_forever() can reach it.
  std::shared_ptr<Storage> borrow() const;
  // Whether this is such a handle: its allocator is the memory's lender, not its owner.
  bool borrowed() const { return lender_ != nullptr; }
  Allocator* lender() const { return lender_.get(); }

 private:
  void* ptr_;
  size_t bytes_;
  Device device_;
  std::shared_ptr<Allocator> alloc_;
  std::function<void(void*)> deleter_;
  std::shared_ptr<Allocator> lender_;  // borrow(): the owner's allocator; never freed through
};

// Philox initialisation: value of full-tensor element i is a function of (seed, id, i) only.
struct MESHRT_API PhiloxInit {
  enum class Dist : uint8_t { Uniform, Normal };
  uint64_t seed = 0;
  uint64_t id = 0;  // tensor / parameter id
  Dist dist = Dist::Uniform;
  float a = 0.f;  // uniform: low;  normal: mean
  float b = 1.f;  // uniform: high; normal: stddev
};

class MESHRT_API Tensor {
 public:
  Tensor() = default;  // undefined tensor

  static Tensor empty(const Shape& shape, DType dtype, const std::shared_ptr<Allocator>& alloc,
                      Stream* stream = nullptr);
  // Wraps external memory (contiguous unless strides given); deleter runs when the last view dies
  // and the work queued on it ran (host tasks hold the storage). Without a deleter the caller owns
  // the memory: it must outlive the work queued on it, also when an exception unwinds past the
  // buffer before the stream ran (synchronize first); to hand a buffer to queued work, use
  // from_host_data.
  static Tensor from_blob(void* ptr, const Shape& shape, DType dtype, Device device,
                          std::function<void(void*)> deleter = nullptr,
                          const Shape* strides = nullptr);
  // A contiguous host tensor holding a copy of `data` (shape.numel() elements of `dtype`) in
  // memory of its own, which the work queued on it keeps alive: the caller's buffer may go at
  // once, e.g. a local vector on an error path, while a copy from the tensor is still queued.
  static Tensor from_host_data(const void* data, const Shape& shape, DType dtype,
                               Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return shape_.ndim(); }
  int64_t size(int d) const { return shape_.at(d); }
  int64_t stride(int d) const { return strides_[shape_.wrap_dim(d)]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }
  int64_t storage_offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data_ptr() const;
  template <class T>
  T* data() const {
    check_element_size(sizeof(T));
    return static_cast<T*>(data_ptr());
  }
  bool is_contiguous() const;
  TensorDesc desc() const;
  std::string str() const;  // "f32[2, 3] on cpu:0"

  // ---- views (share storage; never copy) ----
  Tensor view(const Shape& shape) const;  // contiguous only; one extent may be -1
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor slice(int dim, int64_t start, int64_t end, int64_t step = 1) const;
  // n equal pieces along dim (dim size must divide by n).
  std::vector<Tensor> chunk(int n, int dim) const;
  Tensor transpose(int d0, int d1) const;
  Tensor select(int dim, int64_t index) const;

  // ---- data movement, enqueued on `stream` ----
  // (Mutating methods are const: a Tensor is a handle; they write the storage it views.)
  // A view when possible, else a contiguous copy.
  Tensor reshape(const Shape& shape, Stream& stream) const;
  Tensor contiguous(Stream& stream) const;
  Tensor to(DType dtype, Stream& stream) const;
  // Copies to another device; `alloc` provides the destination memory.
  Tensor to(const std::shared_ptr<Allocator>& alloc, Stream& stream) const;
  // Elementwise copy with dtype conversion (same shape; any strides; same device, or contiguous
  // host <-> CUDA).
  const Tensor& copy_(const Tensor& src, Stream& stream) const;
  const Tensor& fill_(double value, Stream& stream) const;
  const Tensor& zero_(Stream& stream) const { return fill_(0.0, stream); }
  // Fills this tensor, which is the block of a tensor of shape `full_shape` starting at
  // `offsets`, with values that depend only on (init.seed, init.id, global element index):
  // a shard initialised on its own equals the same slice of the full tensor.
  const Tensor& init_philox_(const PhiloxInit& init, const Shape& full_shape, const Shape& offsets,
                             Stream& stream) const;
  const Tensor& init_philox_(const PhiloxInit& init,
                             Stream& stream) const;  // this tensor is the full one

  // The handle a task queued on `stream` captures (host kernels). When the storage comes from a
  // stream-ordered allocator (Allocator::stream_ordered), the handle does not own the block: the
  // program's last handle frees it at once, as on CUDA, and the allocator's stream tags keep it
  // from other streams until this stream's work before the free ran (record_stream when `stream`
  // is not the allocation stream), while later work on the allocation stream reuses it at once.
  // Other storages (external memory, the plain allocator) are kept alive by the task, as before.
  Tensor stream_ref(Stream& stream) const;
  // Keeps this tensor's memory from ever being reused or freed, even when it is a stream_ref
  // whose owner freed it: for the buffers of a collective that failed after an abort, which a
  // peer may still write. The memory stays until the process exits.
  void keep_forever() const;

  // Host tensors only: reads/writes one element as double after the stream work is done.
  double item(int64_t flat_index) const;
  // Host tensors only: the values as doubles (synchronise streams first).
  std::vector<double> to_vector() const;

 private:
  void check_element_size(size_t s) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::f32;
};

}  // namespace meshrt
