// TensorDesc: a plain (pointer, dtype, shape, strides) record passed by value into kernels.
#pragma once

#include <cstdint>

#include "meshrt/export.h"
#include "runtime/dtype.h"

namespace meshrt {

constexpr int kMaxDims = 8;

struct MESHRT_API TensorDesc {
  void* ptr = nullptr;  // points at element 0 of the view (storage offset applied)
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
};

}  // namespace meshrt
