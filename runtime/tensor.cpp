#include "runtime/tensor.h"

#include <cstring>
#include <mutex>
#include <sstream>

#include "runtime/backend.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/logging.h"

namespace meshrt {

// ---- Storage -----------------------------------------------------------------------------------

Storage::Storage(void* ptr, size_t bytes, Device device, std::shared_ptr<Allocator> alloc)
    : ptr_(ptr), bytes_(bytes), device_(device), alloc_(std::move(alloc)) {}

Storage::Storage(void* ptr, size_t bytes, Device device, std::function<void(void*)> deleter)
    : ptr_(ptr), bytes_(bytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  // A destructor must not throw (it would terminate the process, e.g. while a stream drains).
  try {
    if (alloc_) {
      alloc_->deallocate(ptr_);
    } else if (deleter_) {
      deleter_(ptr_);
    }
  } catch (const std::exception& e) {
    MESHRT_LOG_ERROR("freeing " << bytes_ << " bytes on " << device_.str()
                                << " failed (the memory is leaked): " << e.what());
  } catch (...) {
    MESHRT_LOG_ERROR("freeing " << bytes_ << " bytes on " << device_.str()
                                << " failed (the memory is leaked)");
  }
}

void Storage::record_stream(Stream& stream) {
  if (alloc_) alloc_->record_stream(ptr_, stream);
}

std::shared_ptr<Storage> Storage::borrow() const {
  auto s = std::make_shared<Storage>(ptr_, bytes_, device_, std::function<void(void*)>());
  s->lender_ = alloc_;
  return s;
}

// ---- Tensor ------------------------------------------------------------------------------------

void Tensor::keep_forever() const {
  if (!defined()) return;
  if (storage_->borrowed()) {
    storage_->lender()->leak(storage_->data());
    return;
  }
  static std::mutex mu;
  static auto* graveyard = new std::vector<Tensor>;  // leaked on purpose
  std::lock_guard<std::mutex> lk(mu);
  graveyard->push_back(*this);
}

Tensor Tensor::stream_ref(Stream& stream) const {
  if (!defined()) return *this;
  Allocator* a = storage_->allocator();
  if (!a || !a->stream_ordered()) return *this;
  a->record_stream(storage_->data(), stream);
  Tensor t = *this;
  t.storage_ = storage_->borrow();  // same memory, no owner: destroying it frees nothing
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const std::shared_ptr<Allocator>& alloc,
                     Stream* stream) {
  MESHRT_CHECK(alloc != nullptr, "Tensor::empty" << shape.str() << ": no allocator");
  int64_t n = shape.numel();
  int64_t bytes;
  MESHRT_CHECK(
      !__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &bytes),
      "Tensor::empty: byte size of " << dtype_name(dtype) << shape.str() << " overflows int64");
  void* p = alloc->allocate(static_cast<size_t>(bytes), stream);
  Tensor t;
  t.storage_ = std::make_shared<Storage>(p, static_cast<size_t>(bytes), alloc->device(), alloc);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_host_data(const void* data, const Shape& shape, DType dtype, Device device) {
  MESHRT_CHECK(device.is_cpu(),
               "Tensor::from_host_data: " << device.str() << " is not a host device");
  MESHRT_CHECK(
      data != nullptr || shape.numel() == 0,
      "Tensor::from_host_data: null data for a non-empty " << dtype_name(dtype) << shape.str());
  // The plain allocator's storages are owned by the host tasks that use them (stream_ref), and
  // its fresh memory is not in use by queued work, so the copy below is safe at once.
  Tensor t = empty(shape, dtype, make_host_plain_allocator(device.index));
  if (t.nbytes() > 0) std::memcpy(t.data_ptr(), data, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* ptr, const Shape& shape, DType dtype, Device device,
                         std::function<void(void*)> deleter, const Shape* strides) {
  MESHRT_CHECK(
      ptr != nullptr || shape.numel() == 0,
      "Tensor::from_blob: null pointer for a non-empty " << dtype_name(dtype) << shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  if (strides) {
    MESHRT_CHECK(strides->ndim() == shape.ndim(), "Tensor::from_blob: strides "
                                                      << strides->str() << " do not match shape "
                                                      << shape.str());
    t.strides_ = *strides;
  } else {
    t.strides_ = contiguous_strides(shape);
  }
  // Span in bytes (for bookkeeping): largest reachable element + 1.
  int64_t span = shape.numel() == 0 ? 0 : 1;
  for (int i = 0; i < shape.ndim() && span; ++i) {
    MESHRT_CHECK(t.strides_[i] >= 0,
                 "Tensor::from_blob: negative stride " << t.strides_[i] << " in dim " << i);
    span += (shape[i] - 1) * t.strides_[i];
  }
  t.storage_ = std::make_shared<Storage>(ptr, static_cast<size_t>(span) * dtype_size(dtype), device,
                                         std::move(deleter));
  return t;
}

Device Tensor::device() const {
  MESHRT_CHECK(defined(), "device() of an undefined tensor");
  return storage_->device();
}

void* Tensor::data_ptr() const {
  MESHRT_CHECK(defined(), "data_ptr() of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

void Tensor::check_element_size(size_t s) const {
  MESHRT_CHECK(s == element_size(),
               "Tensor::data<T>: sizeof(T)=" << s << " but tensor is " << dtype_name(dtype_));
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // an empty tensor touches no memory
  int64_t expect = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

TensorDesc Tensor::desc() const {
  TensorDesc d;
  d.ptr = defined() ? data_ptr() : nullptr;
  d.dtype = dtype_;
  d.ndim = ndim();
  for (int i = 0; i < ndim(); ++i) {
    d.shape[i] = shape_[i];
    d.strides[i] = strides_[i];
  }
  return d;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  std::ostringstream os;
  os << dtype_name(dtype_) << shape_.str() << " on " << device().str();
  return os.str();
}

Tensor Tensor::view(const Shape& shape) const {
  MESHRT_CHECK(defined(), "view of an undefined tensor");
  MESHRT_CHECK(is_contiguous(), "view" << shape.str() << " of non-contiguous " << str()
                                       << " (strides " << strides_.str()
                                       << "): call contiguous() or reshape() first");
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.ndim(); ++i) {
    if (s[i] == -1) {
      MESHRT_CHECK(infer < 0, "view" << shape.str() << ": only one extent may be -1");
      infer = i;
    } else {
      MESHRT_CHECK(s[i] >= 0, "view" << shape.str() << ": negative extent " << s[i]);
      MESHRT_CHECK(!__builtin_mul_overflow(known, s[i], &known),
                   "view" << shape.str() << ": element count overflows");
    }
  }
  if (infer >= 0) {
    MESHRT_CHECK(known > 0 && numel() % known == 0,
                 "view" << shape.str() << " of " << str() << ": cannot infer the -1 extent");
    s[infer] = numel() / known;
  }
  MESHRT_CHECK(s.numel() == numel(), "view" << shape.str() << " of " << str() << ": " << s.numel()
                                            << " elements vs " << numel());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  int d = shape_.wrap_dim(dim);
  MESHRT_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
               "narrow(dim=" << dim << ", start=" << start << ", length=" << length << ") out of "
                             << "range for " << str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::slice(int dim, int64_t start, int64_t end, int64_t step) const {
  int d = shape_.wrap_dim(dim);
  MESHRT_CHECK(step >= 1, "slice: step " << step << " must be >= 1");
  MESHRT_CHECK(
      start >= 0 && start <= end && end <= shape_[d],
      "slice(dim=" << dim << ", " << start << ":" << end << ") out of range for " << str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = (end - start + step - 1) / step;
  t.strides_[d] = strides_[d] * step;
  return t;
}

std::vector<Tensor> Tensor::chunk(int n, int dim) const {
  int d = shape_.wrap_dim(dim);
  MESHRT_CHECK(n >= 1 && shape_[d] % n == 0, "chunk(" << n << ", dim=" << dim << ") of " << str()
                                                      << ": size " << shape_[d]
                                                      << " does not divide into " << n);
  std::vector<Tensor> out;
  int64_t len = shape_[d] / n;
  for (int i = 0; i < n; ++i) out.push_back(narrow(d, i * len, len));
  return out;
}

Tensor Tensor::transpose(int d0, int d1) const {
  int a = shape_.wrap_dim(d0), b = shape_.wrap_dim(d1);
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::select(int dim, int64_t index) const {
  int d = shape_.wrap_dim(dim);
  MESHRT_CHECK(index >= 0 && index < shape_[d],
               "select(dim=" << dim << ", index=" << index << ") out of range for " << str());
  Tensor t = *this;
  t.offset_ += index * strides_[d];
  Shape s, st;
  for (int i = 0; i < ndim(); ++i)
    if (i != d) {
      s.push_back(shape_[i]);
      st.push_back(strides_[i]);
    }
  t.shape_ = s;
  t.strides_ = st;
  return t;
}

Tensor Tensor::reshape(const Shape& shape, Stream& stream) const {
  if (is_contiguous()) return view(shape);
  return contiguous(stream).view(shape);
}

Tensor Tensor::contiguous(Stream& stream) const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_,
                     storage_->allocator_ptr() ? storage_->allocator_ptr() : nullptr, &stream);
  out.copy_(*this, stream);
  return out;
}

Tensor Tensor::to(DType dtype, Stream& stream) const {
  if (dtype == dtype_) return *this;
  MESHRT_CHECK(storage_->allocator_ptr(), "to(" << dtype_name(dtype) << ") of " << str()
                                                << ": external memory has no allocator");
  Tensor out = empty(shape_, dtype, storage_->allocator_ptr(), &stream);
  out.copy_(*this, stream);
  return out;
}

Tensor Tensor::to(const std::shared_ptr<Allocator>& alloc, Stream& stream) const {
  MESHRT_CHECK(alloc, "to(allocator) of " << str() << ": null allocator");
  if (alloc->device() == device()) return *this;
  Tensor src = contiguous(stream);
  Tensor out = empty(shape_, dtype_, alloc, &stream);
  out.copy_(src, stream);
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src, Stream& stream) const {
  MESHRT_CHECK(defined() && src.defined(), "copy_: undefined tensor");
  MESHRT_CHECK(shape_ == src.shape_,
               "copy_: shape " << src.shape_.str() << " into " << shape_.str());
  if (numel() == 0) return *this;
  if (device() == src.device() || (device().is_cpu() && src.device().is_cpu())) {
    const DeviceRuntime& be = backend_for(device());
    be.copy_strided(desc(), src.desc(), stream);
    if (be.type() == DeviceType::CPU) {
      // Keep both storages alive until the copy task has run, or (stream-ordered allocators)
      // mark their use on this stream.
      Tensor a = stream_ref(stream), b = src.stream_ref(stream);
      stream.enqueue([a, b] {});
    } else {
      src.storage_->record_stream(stream);
      storage_->record_stream(stream);
    }
    return *this;
  }
  MESHRT_CHECK(dtype_ == src.dtype_ && is_contiguous() && src.is_contiguous(),
               "copy_ across devices (" << src.str() << " -> " << str()
                                        << ") needs equal dtypes and contiguous tensors");
  const DeviceRuntime& be = backend_for(device().is_cuda() ? device() : src.device());
  be.memcpy_async(data_ptr(), device(), src.data_ptr(), src.device(), nbytes(), stream);
  src.storage_->record_stream(stream);
  storage_->record_stream(stream);
  // Both storages live until the copy has run (an allocator without stream-aware reuse, or the
  // last reference dropped right after this call, must not free memory a DMA still reads).
  stream.hold_until_done(storage_);
  stream.hold_until_done(src.storage_);
  return *this;
}

const Tensor& Tensor::fill_(double value, Stream& stream) const {
  MESHRT_CHECK(defined(), "fill_: undefined tensor");
  if (numel() == 0) return *this;
  backend_for(device()).fill(desc(), value, stream);
  if (device().is_cpu()) {
    Tensor a = stream_ref(stream);
    stream.enqueue([a] {});
  } else {
    storage_->record_stream(stream);
  }
  return *this;
}

const Tensor& Tensor::init_philox_(const PhiloxInit& init, const Shape& full_shape,
                                   const Shape& offsets, Stream& stream) const {
  MESHRT_CHECK(defined(), "init_philox_: undefined tensor");
  MESHRT_CHECK(is_floating(dtype_), "init_philox_: " << str() << " is not a floating dtype");
  MESHRT_CHECK(full_shape.ndim() == ndim() && offsets.ndim() == ndim(),
               "init_philox_: shard " << shape_.str() << ", full " << full_shape.str()
                                      << " and offsets " << offsets.str()
                                      << " must have the same rank");
  for (int i = 0; i < ndim(); ++i)
    MESHRT_CHECK(offsets[i] >= 0 && offsets[i] + shape_[i] <= full_shape[i],
                 "init_philox_: shard " << shape_.str() << " at offsets " << offsets.str()
                                        << " does not fit in full shape " << full_shape.str());
  full_shape.numel();  // overflow check
  if (numel() == 0) return *this;
  backend_for(device()).init_philox(desc(), init, full_shape, offsets, stream);
  if (device().is_cpu()) {
    Tensor a = stream_ref(stream);
    stream.enqueue([a] {});
  } else {
    storage_->record_stream(stream);
  }
  return *this;
}

const Tensor& Tensor::init_philox_(const PhiloxInit& init, Stream& stream) const {
  Shape zeros = shape_;
  for (int i = 0; i < zeros.ndim(); ++i) zeros[i] = 0;
  return init_philox_(init, shape_, zeros, stream);
}

double Tensor::item(int64_t flat_index) const {
  MESHRT_CHECK(defined() && device().is_cpu(), "item(): " << str() << " is not a host tensor");
  MESHRT_CHECK(flat_index >= 0 && flat_index < numel(),
               "item(" << flat_index << ") out of range for " << str());
  int64_t off = 0, rem = flat_index;
  for (int i = ndim() - 1; i >= 0; --i) {
    off += (rem % shape_[i]) * strides_[i];
    rem /= shape_[i];
  }
  return load_as_double(data_ptr(), dtype_, off);
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[static_cast<size_t>(i)] = item(i);
  return v;
}

}  // namespace meshrt
