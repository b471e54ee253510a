// Kernel launchers of the CUDA backend (cuda_tensor_ops.cu), called by cuda_backend.cpp with the
// stream's device current. Internal to backends/cuda/runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/shape.h"
#include "runtime/tensor.h"
#include "runtime/tensor_desc.h"

namespace meshrt::cuda_detail {

// dst[i] = convert(src[i]) for every index of dst's shape; any strides, any dtype pair.
void launch_copy_strided(TensorDesc dst, TensorDesc src, cudaStream_t stream);
// dst[i] = value converted to dst's dtype exactly as the host backend converts it.
void launch_fill(TensorDesc dst, double value, cudaStream_t stream);
// The values of host_init_philox, bit for bit where the math is IEEE basic operations.
void launch_init_philox(TensorDesc dst, const PhiloxInit& init, const Shape& full_shape,
                        const Shape& offsets, cudaStream_t stream);
// Holds `stream` until *released >= ticket; `released` is host memory mapped for the device and
// written by the host (the gate behind Stream::wait on a host event).
void launch_host_gate(const volatile uint64_t* released, uint64_t ticket, cudaStream_t stream);

}  // namespace meshrt::cuda_detail
