// DLPack tensors of the C API: import (borrowed DLTensor, DLManagedTensor, versioned managed
// tensor) as zero-copy meshrt tensors, allocation, and export with a deleter that frees through
// meshrt's allocator.
#include <vector>

#include "capi/capi_internal.h"
#include "capi/dlpack_versioned.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/tensor_desc.h"

namespace meshrt::capi {

namespace {

std::string dl_dtype_str(DLDataType t) {
  std::ostringstream os;
  os << "(code " << static_cast<int>(t.code) << ", bits " << static_cast<int>(t.bits) << ", lanes "
     << t.lanes << ")";
  return os.str();
}

DType dtype_from_dl(DLDataType t) {
  CAPI_CHECK(t.lanes == 1, MESHRT_ERROR_INVALID_ARGUMENT,
             "DLPack dtype " << dl_dtype_str(t)
                             << " has vector lanes: meshrt takes scalar dtypes (lanes 1)");
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  if (t.code == kDLInt && t.bits == 64) return DType::i64;
  if (t.code == kDLUInt && t.bits == 8) return DType::u8;
  fail(MESHRT_ERROR_INVALID_ARGUMENT,
       "DLPack dtype " + dl_dtype_str(t) +
           " is not supported: use float32, bfloat16, float16, int32, int64 (or uint8 for "
           "data movement only)");
}

DLDataType dl_from_dtype(DType t) {
  DLDataType d{};
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(dtype_size(t) * 8);
  switch (t) {
    case DType::f32:
    case DType::f16:
      d.code = kDLFloat;
      break;
    case DType::bf16:
      d.code = kDLBfloat;
      break;
    case DType::i32:
    case DType::i64:
      d.code = kDLInt;
      break;
    case DType::u8:
      d.code = kDLUInt;
      break;
  }
  return d;
}

std::string dims_str(const int64_t* p, int n) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << p[i];
  os << "]";
  return os.str();
}

// The elements of `shape` (`what`: how the message names it): extents >= 0 whose product fits
// in int64, else MESHRT_ERROR_INVALID_ARGUMENT. Borrowed and allocated tensors share it.
int64_t checked_numel(const char* what, const int64_t* shape, int ndim) {
  int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) {
    CAPI_CHECK(shape[i] >= 0, MESHRT_ERROR_INVALID_ARGUMENT,
               what << " " << dims_str(shape, ndim) << " has a negative extent");
    CAPI_CHECK(!__builtin_mul_overflow(numel, shape[i], &numel), MESHRT_ERROR_INVALID_ARGUMENT,
               what << " " << dims_str(shape, ndim) << " has more elements than int64");
  }
  return numel;
}

// The device of a DLTensor: kDLCPU (DLPack has one CPU device: device_id 0) or kDLCUDA (an id
// below this process's CUDA device count; without a usable CUDA backend the id is checked where
// the tensor is used, against the communicator's device).
Device device_from_dl(DLDevice d) {
  if (d.device_type == kDLCPU) {
    CAPI_CHECK(d.device_id == 0, MESHRT_ERROR_INVALID_ARGUMENT,
               "DLTensor device is kDLCPU with device_id "
                   << d.device_id << ": DLPack has one CPU device, whose device_id is 0; pass 0");
    return Device::cpu(0);
  }
  if (d.device_type == kDLCUDA) {
    CAPI_CHECK(d.device_id >= 0, MESHRT_ERROR_INVALID_ARGUMENT,
               "DLTensor device is kDLCUDA with device_id "
                   << d.device_id << ": pass the index of the GPU holding the memory (>= 0)");
    const int count = cuda_available() ? cuda_device_count() : -1;
    CAPI_CHECK(count < 0 || d.device_id < count, MESHRT_ERROR_INVALID_ARGUMENT,
               "DLTensor device is kDLCUDA with device_id "
                   << d.device_id << " but this process sees " << count
                   << " CUDA device(s): pass the index of the GPU holding the memory, 0 .. "
                   << count - 1);
    return Device::cuda(d.device_id);
  }
  fail(MESHRT_ERROR_UNSUPPORTED,
       "DLTensor device_type " + std::to_string(static_cast<int>(d.device_type)) +
           " is not supported: meshrt takes kDLCPU (1) and kDLCUDA (2) tensors");
}

// The meshrt tensor viewing `t`'s memory; `deleter` (may be empty) runs when the last view dies.
// Every check runs before the storage is made, so on failure nothing owns the caller's memory.
Tensor tensor_from_dl(const DLTensor& t, std::function<void(void*)> deleter) {
  CAPI_CHECK(t.ndim >= 0 && t.ndim <= kMaxDims, MESHRT_ERROR_INVALID_ARGUMENT,
             "DLTensor ndim " << t.ndim << " is outside [0, " << kMaxDims << "]");
  CAPI_CHECK(t.ndim == 0 || t.shape != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             "DLTensor shape is NULL for ndim " << t.ndim << ": pass its extents");
  const DType dt = dtype_from_dl(t.dtype);
  const Device dev = device_from_dl(t.device);
  std::vector<int64_t> dims(t.shape, t.shape + t.ndim);
  const int64_t numel = checked_numel("DLTensor shape", t.shape, t.ndim);
  if (t.strides != nullptr) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      const int64_t e = dims[static_cast<size_t>(i)];
      CAPI_CHECK(e == 1 || t.strides[i] == expect || numel == 0, MESHRT_ERROR_INVALID_ARGUMENT,
                 "DLTensor with shape " << dims_str(t.shape, t.ndim) << " has strides "
                                        << dims_str(t.strides, t.ndim)
                                        << " (elements), not the row-major (C-contiguous) ones: "
                                           "meshrt needs contiguous tensors; copy it to a "
                                           "contiguous one first (e.g. .contiguous() / "
                                           "np.ascontiguousarray)");
      expect *= e;
    }
  }
  CAPI_CHECK(t.data != nullptr || numel == 0, MESHRT_ERROR_INVALID_ARGUMENT,
             "DLTensor data is NULL for shape " << dims_str(t.shape, t.ndim));
  CAPI_CHECK(t.byte_offset % dtype_size(dt) == 0, MESHRT_ERROR_INVALID_ARGUMENT,
             "DLTensor byte_offset " << t.byte_offset << " is not a multiple of the element size "
                                     << dtype_size(dt));
  // The bytes it spans must lie in the address space (user pointers stay below 2^57): an offset
  // that wraps the pointer around, e.g. a negative one passed as unsigned, is refused, not used.
  uint64_t end = 0;
  const bool wraps =
      __builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(dt), &end) ||
      __builtin_add_overflow(end, t.byte_offset, &end) ||
      __builtin_add_overflow(end, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data)), &end);
  CAPI_CHECK(t.data == nullptr || (!wraps && end <= (uint64_t{1} << 57)),
             MESHRT_ERROR_INVALID_ARGUMENT,
             "DLTensor data " << t.data << " + byte_offset " << t.byte_offset << " + " << numel
                              << " elements of " << dtype_size(dt)
                              << " bytes runs past the address space: is byte_offset a negative "
                                 "number passed as unsigned?");
  void* data = t.data ? static_cast<char*>(t.data) + t.byte_offset : nullptr;
  return Tensor::from_blob(data, Shape(dims), dt, dev, std::move(deleter));
}

meshrt_tensor_t add_tensor(Tensor t, bool read_only) {
  auto obj = std::make_shared<TensorObj>();
  obj->tensor = std::move(t);
  obj->read_only = read_only;
  return static_cast<meshrt_tensor_t>(Registry::get().add(Kind::Tensor, obj));
}

// What an exported DLPack tensor's manager_ctx points to.
template <class Managed>
struct Export {
  Tensor tensor;  // keeps the memory (and its allocator) alive
  std::vector<int64_t> shape, strides;
  Managed managed{};
};

template <class Managed>
Export<Managed>* make_export(const Tensor& t) {
  auto* e = new Export<Managed>();
  e->tensor = t;
  e->shape = t.shape().vec();
  e->strides = t.strides().vec();
  DLTensor& d = e->managed.dl_tensor;
  d.data = t.numel() ? t.data_ptr() : nullptr;
  d.device.device_type = t.device().is_cuda() ? kDLCUDA : kDLCPU;
  d.device.device_id = t.device().is_cuda() ? t.device().index : 0;
  d.ndim = t.ndim();
  d.dtype = dl_from_dtype(t.dtype());
  d.shape = e->shape.data();
  d.strides = e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  return e;
}

}  // namespace

}  // namespace meshrt::capi

using namespace meshrt;
using namespace meshrt::capi;

extern "C" {

meshrt_status_t meshrt_tensor_from_dltensor(const DLTensor* t, meshrt_tensor_t* tensor) {
  return guarded(__func__, [&] {
    check_out(tensor, "tensor");
    *tensor = nullptr;
    CAPI_CHECK(t != nullptr, MESHRT_ERROR_INVALID_ARGUMENT, "t is NULL: pass a DLTensor");
    *tensor = add_tensor(tensor_from_dl(*t, nullptr), false);
  });
}

meshrt_status_t meshrt_tensor_from_dlpack(DLManagedTensor* t, meshrt_tensor_t* tensor) {
  return guarded(__func__, [&] {
    check_out(tensor, "tensor");
    *tensor = nullptr;
    CAPI_CHECK(t != nullptr, MESHRT_ERROR_INVALID_ARGUMENT, "t is NULL: pass a DLManagedTensor");
    std::function<void(void*)> del = [t](void*) {
      if (t->deleter) t->deleter(t);
    };
    *tensor = add_tensor(tensor_from_dl(t->dl_tensor, std::move(del)), false);
  });
}

meshrt_status_t meshrt_tensor_from_dlpack_versioned(DLManagedTensorVersioned* t,
                                                    meshrt_tensor_t* tensor) {
  return guarded(__func__, [&] {
    check_out(tensor, "tensor");
    *tensor = nullptr;
    CAPI_CHECK(t != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "t is NULL: pass a DLManagedTensorVersioned");
    CAPI_CHECK(t->version.major == kDLPackMajor, MESHRT_ERROR_UNSUPPORTED,
               "DLManagedTensorVersioned has DLPack version "
                   << t->version.major << "." << t->version.minor << " but meshrt reads major "
                   << kDLPackMajor << " (a different major version is a different ABI)");
    std::function<void(void*)> del = [t](void*) {
      if (t->deleter) t->deleter(t);
    };
    *tensor = add_tensor(tensor_from_dl(t->dl_tensor, std::move(del)),
                         (t->flags & kDLPackFlagReadOnly) != 0);
  });
}

meshrt_status_t meshrt_tensor_empty(meshrt_comm_t comm, int ndim, const int64_t* shape,
                                    DLDataType dtype, meshrt_tensor_t* tensor) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    check_out(tensor, "tensor");
    *tensor = nullptr;
    CAPI_CHECK(ndim >= 0 && ndim <= kMaxDims, MESHRT_ERROR_INVALID_ARGUMENT,
               "ndim " << ndim << " is outside [0, " << kMaxDims << "]");
    CAPI_CHECK(ndim == 0 || shape != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "shape is NULL for ndim " << ndim);
    (void)checked_numel("shape", shape, ndim);
    const DType dt = dtype_from_dl(dtype);
    std::vector<int64_t> dims(shape, shape + ndim);
    *tensor = add_tensor(c->ctx->empty(Shape(dims), dt), false);
  });
}

meshrt_status_t meshrt_tensor_to_dlpack(meshrt_tensor_t tensor, DLManagedTensor** out) {
  return guarded(__func__, [&] {
    auto t = find_tensor(tensor, "tensor");
    check_out(out, "out");
    auto* e = make_export<DLManagedTensor>(t->tensor);
    e->managed.deleter = [](DLManagedTensor* self) {
      delete static_cast<Export<DLManagedTensor>*>(self->manager_ctx);
    };
    *out = &e->managed;
  });
}

meshrt_status_t meshrt_tensor_to_dlpack_versioned(meshrt_tensor_t tensor,
                                                  DLManagedTensorVersioned** out) {
  return guarded(__func__, [&] {
    auto t = find_tensor(tensor, "tensor");
    check_out(out, "out");
    auto* e = make_export<DLManagedTensorVersioned>(t->tensor);
    e->managed.version.major = kDLPackMajor;
    e->managed.version.minor = kDLPackMinor;
    e->managed.flags = t->read_only ? kDLPackFlagReadOnly : 0;
    e->managed.deleter = [](DLManagedTensorVersioned* self) {
      delete static_cast<Export<DLManagedTensorVersioned>*>(self->manager_ctx);
    };
    *out = &e->managed;
  });
}

meshrt_status_t meshrt_tensor_destroy(meshrt_tensor_t tensor) {
  return guarded(__func__, [&] {
    if (tensor == nullptr) return;
    CAPI_CHECK(Registry::get().remove(tensor, Kind::Tensor) != nullptr, MESHRT_ERROR_INVALID_USAGE,
               "tensor (" << static_cast<void*>(tensor)
                          << ") is not a live tensor handle: it was destroyed already or never "
                             "created by meshrt");
  });
}

}  // extern "C"
