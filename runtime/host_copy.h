// The host's strided copy (with dtype conversion) and fill, run synchronously on the calling
// thread: the one implementation behind Tensor::copy_ / fill_ on host streams and the host
// kernels' cast / fill (which split contiguous work across the rank's threads). Internal.
#pragma once

#include "runtime/tensor_desc.h"

namespace meshrt {

// dst = src converted to dst's dtype element by element (same shape; any strides).
void host_copy_strided(const TensorDesc& dst, const TensorDesc& src);
// Every element of dst = value converted to dst's dtype.
void host_fill(const TensorDesc& dst, double value);

}  // namespace meshrt
